"""Known values of fake tensors, for the host-side reads a program's control flow needs.

A fake tensor has no data, but many tensors a program branches on are uniform by
construction: `torch.ones(B)` (generate's unfinished sequences), `torch.full((B,), is_done)`
(its stopping criteria), their `&`, `|`, `~`, `max()`, `== 0`. This tracks, per storage, a
value every element holds when the ops that made it say so (creation with a fill value,
elementwise ops of known values, reductions, casts), including the partial rules `x & 0 ==
0` and `x | True == True`, so `bool(unfinished.max() == 0)` is answered exactly and a
`generate()` loop stops at max_new_tokens as on the GPU. Anything else is unknown: `.item()`
then answers a placeholder with a warning (mode.py).

Views share their base's storage, so they share its value; an in-place op that writes a
whole storage with a known value sets it, any other write forgets it.
"""

import math

UNKNOWN = object()


def _cast(v, dtype):
    import torch

    if v is UNKNOWN:
        return v
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point or dtype.is_complex:
        return float(v)
    try:
        return int(v)
    except (OverflowError, ValueError):
        return UNKNOWN


class Values:
    def __init__(self):
        import torch
        from torch._subclasses.fake_tensor import FakeTensor

        self.FakeTensor = FakeTensor
        self.torch = torch
        self.v = {}
        self.rules = self._rules()

    def key(self, t):
        try:
            return t.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 - sparse/nested: never known
            return None

    def get(self, x):
        if isinstance(x, bool):
            return x
        if isinstance(x, (int, float)):
            return x
        if isinstance(x, self.FakeTensor):
            k = self.key(x)
            if k in self.v:
                return _cast(self.v[k], x.dtype)
            c = getattr(x, "constant", None)
            if c is not None and c.numel() >= 1:
                from torch._subclasses.fake_tensor import unset_fake_temporarily

                with unset_fake_temporarily():
                    flat = c.flatten()
                    if bool((flat == flat[0]).all()):
                        return flat[0].item()
            return UNKNOWN
        return UNKNOWN

    def known(self, t):
        """The value every element of fake tensor `t` holds, or None when unknown."""
        v = self.get(t)
        return None if v is UNKNOWN else v

    def presume(self, t, value):
        """Give `t`'s storage a value the program's data would decide (libs.py says which
        and why); the caller warns."""
        k = self.key(t)
        if k is not None:
            self.v[k] = _cast(value, t.dtype)

    def _rules(self):
        K = UNKNOWN
        g = self.get

        def both(f):
            def r(a, kw):
                x, y = g(a[0]), g(a[1])
                if x is K or y is K:
                    return K
                return f(x, y)
            return r

        def and_(a, kw):
            x, y = g(a[0]), g(a[1])
            if (x is not K and not x) or (y is not K and not y):
                return 0
            if x is K or y is K:
                return K
            return x & y if isinstance(x, int) and isinstance(y, int) else (x and y)

        def or_(a, kw):
            x, y = g(a[0]), g(a[1])
            if (x is not K and x is True) or (y is not K and y is True):
                return True
            if x is K or y is K:
                return K
            return x | y if isinstance(x, int) and isinstance(y, int) else (x or y)

        def first(a, kw):
            return g(a[0])

        def add(a, kw):
            x, y = g(a[0]), g(a[1])
            al = kw.get("alpha", a[2] if len(a) > 2 else 1)
            return K if K in (x, y) else x + al * y

        def sub(a, kw):
            x, y = g(a[0]), g(a[1])
            al = kw.get("alpha", a[2] if len(a) > 2 else 1)
            return K if K in (x, y) else x - al * y

        def bnot(a, kw):
            x = g(a[0])
            if x is K:
                return K
            return (not x) if isinstance(x, bool) or a[0].dtype == self.torch.bool else ~int(x)

        def numel_sum(a, kw):
            x = g(a[0])
            if x is K or len(a) > 1 and a[1] not in (None, [], ()):
                return K
            return x * a[0].numel()

        def reduce_same(a, kw):
            if len(a) > 1 and a[1] not in (None, [], ()):
                # with dims: still uniform
                pass
            return g(a[0])

        def val(i, default=None):
            return lambda a, kw: g(a[i]) if len(a) > i else default

        def div(a, kw):
            x, y = g(a[0]), g(a[1])
            if K in (x, y) or y == 0:
                return K
            return x / y

        def same(a, kw):
            # cat/stack of tensors that all hold one known value (generate() extends its
            # attention mask with new_ones every step)
            ts = a[0] if a else ()
            vs = [g(t) for t in ts]
            if not vs or K in vs or any(v != vs[0] for v in vs):
                return K
            return vs[0]

        r = {
            "cat": same, "stack": same,
            "full": val(1), "full_like": val(1), "new_full": val(2), "scalar_tensor": val(0),
            "zeros": lambda a, kw: 0, "zeros_like": lambda a, kw: 0, "new_zeros": lambda a, kw: 0,
            "ones": lambda a, kw: 1, "ones_like": lambda a, kw: 1, "new_ones": lambda a, kw: 1,
            "fill": val(1), "fill_": val(1), "zero_": lambda a, kw: 0,
            "clone": first, "_to_copy": first, "copy": val(1), "copy_": val(1),
            "repeat": first, "index_select": first, "gather": first, "index": first,
            "expand_copy": first, "contiguous": first, "lift_fresh_copy": first,
            "bitwise_and": and_, "logical_and": and_, "bitwise_and_": and_, "logical_and_": and_,
            "bitwise_or": or_, "logical_or": or_, "bitwise_or_": or_, "logical_or_": or_,
            "mul": and_, "mul_": and_,
            "bitwise_not": bnot, "logical_not": lambda a, kw: K if g(a[0]) is K else (not g(a[0])),
            "neg": lambda a, kw: K if g(a[0]) is K else -g(a[0]),
            "abs": lambda a, kw: K if g(a[0]) is K else abs(g(a[0])),
            "eq": both(lambda x, y: x == y), "ne": both(lambda x, y: x != y),
            "lt": both(lambda x, y: x < y), "le": both(lambda x, y: x <= y),
            "gt": both(lambda x, y: x > y), "ge": both(lambda x, y: x >= y),
            "add": add, "add_": add, "sub": sub, "sub_": sub, "rsub": lambda a, kw: sub((a[1], a[0]) + tuple(a[2:]), kw),
            "div": div, "div_": div,
            "maximum": both(max), "minimum": both(min),
            "max": reduce_same, "min": reduce_same, "amax": reduce_same, "amin": reduce_same,
            "mean": reduce_same,
            "all": lambda a, kw: K if g(a[0]) is K else bool(g(a[0])),
            "any": lambda a, kw: K if g(a[0]) is K else bool(g(a[0])),
            "sum": numel_sum,
        }
        return r

    def after(self, func, args, kwargs, out):
        """Record (or forget) the value of each storage the op wrote."""
        name = func.overloadpacket.__name__
        rule = self.rules.get(name)
        mutable = func._schema.is_mutable
        FT = self.FakeTensor
        if mutable:
            # the written tensors: outputs aliasing inputs, and out= arguments
            targets = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, FT)]
            if not targets:
                targets = [a for a in args if isinstance(a, FT)][:1]
            for t in targets:
                k = self.key(t)
                if k is None:
                    continue
                v = rule(args, kwargs) if rule is not None else UNKNOWN
                st = t.untyped_storage()
                whole = t.numel() * t.element_size() == st.nbytes()
                old = self.v.get(k, UNKNOWN)
                if v is not UNKNOWN and (whole or (old is not UNKNOWN and old == v)):
                    self.v[k] = _cast(v, t.dtype)
                else:
                    self.v.pop(k, None)
            return
        if isinstance(out, FT):
            outs = (out,)
        elif isinstance(out, (tuple, list)):
            outs = [o for o in out if isinstance(o, FT)]
            if name in ("max", "min") and len(outs) == 2:  # (values, indices)
                outs = outs[:1] + []
                self._forget(out[1] if isinstance(out[1], FT) else None, args)
        else:
            return
        in_keys = None
        for o in outs:
            k = self.key(o)
            if k is None:
                continue
            if in_keys is None:
                in_keys = {self.key(a) for a in args if isinstance(a, FT)}
            if k in in_keys:
                continue  # a view: shares its base's value
            v = rule(args, kwargs) if rule is not None else UNKNOWN
            if v is UNKNOWN or (isinstance(v, float) and math.isnan(v)):
                self.v.pop(k, None)
            else:
                self.v[k] = _cast(v, o.dtype)

    def _forget(self, t, args):
        if t is not None:
            k = self.key(t)
            if k is not None:
                self.v.pop(k, None)
