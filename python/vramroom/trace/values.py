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

Small tensors also get a shadow: the real values of their storage, kept on the host, when
every input of the op that made them is known (a uniform value, a shadow, a CPU constant,
a number) and the op is deterministic. The op is run for real on the shadows, so values
that are not uniform are followed too: `torch.arange` and what is computed from it.
transformers' packed-sequence check reads `(diff(position_ids) != 1).cumsum(-1)[:, -1] ==
0` from an arange; without the shadow the fake run answered "packed" and built the 4-d mask
a GPU run skips (hf_gpt2_grad_ckpt). A shadow is kept only up to SHADOW_LIMIT elements of
storage, and the oldest are forgotten past SHADOW_COUNT shadows or SHADOW_TOTAL elements, so
the cost is bounded; a larger or unknown input leaves the output unknown. The limit is 4M
elements, not less, so that a graph's edge list built from aranges (800,000 edges) is known
to the unique and bincount that size its outputs (datadep.py).

Random integers keep their bounds: `torch.randint(0, 4, (B,))` holds values in [0, 3], as do
its copies, casts and gathers, so a comparison the bounds decide (`labels >= 0`, DeBERTa's
check of which labels to keep before a nonzero) is a known value like any other. Their own
values stay unknown.
"""

import math
import weakref

UNKNOWN = object()
FINITE_PRESUMED = "a finiteness check (isfinite/isnan/isinf) of fake data presumed finite"
SHADOW_LIMIT = 1 << 22
SHADOW_COUNT = 512
SHADOW_TOTAL = 1 << 25  # elements over all shadows (256 MiB of int64 at most)

# deterministic by tag but their outputs hold no values (or change storages' shape)
_NO_SHADOW = frozenset(("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                        "empty_permuted", "resize_", "resize_as_", "set_", "_local_scalar_dense",
                        "_assert_async", "record_stream"))

# ops whose output holds only values of their first input (bounds carry over)
_MOVES_VALUES = frozenset(("clone", "_to_copy", "contiguous", "gather", "index_select", "index",
                           "repeat", "expand_copy", "lift_fresh_copy", "take",
                           "take_along_dim"))


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
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        self.FakeTensor = FakeTensor
        self.torch = torch
        # host values are read and made with fake mode off: a library patch asks from
        # inside the user's program, where the mode is on
        self.host = unset_fake_temporarily
        self.v = {}
        self.shadow = {}  # storage key -> 1-d host tensor of the storage's elements
        self._elems = 0  # elements kept in shadows (an upper bound until _trim counts)
        self._watch = {}  # storage key -> weak reference whose callback forgets the key
        self.bounds = {}  # storage key -> (lo, hi): every element in [lo, hi] (randint)
        self.rules = self._rules()

    def key(self, t):
        """The storage's identity (its address), watched: what is known of it is forgotten
        when the storage dies, before the address can be reused. A stale entry answered for
        a new storage at the same address: Wav2Vec2's LayerDrop draw, `torch.rand([])`, read
        an old shadow's value, so traces of one program skipped different layers."""
        try:
            st = t.untyped_storage()
            k = st._cdata
        except Exception:  # noqa: BLE001 - sparse/nested: never known
            return None
        if k not in self._watch:
            try:
                self._watch[k] = weakref.ref(st, self._on_dead(k))
            except TypeError:  # no weak reference to it: nothing kept about it is trusted
                return None
        return k

    def _on_dead(self, k):
        def forget(ref):
            if self._watch.get(k) is ref:
                del self._watch[k]
                self.v.pop(k, None)
                self.shadow.pop(k, None)
                self.bounds.pop(k, None)
        return forget

    def get(self, x):
        if isinstance(x, bool):
            return x
        if isinstance(x, (int, float)):
            return x
        if isinstance(x, self.FakeTensor):
            k = self.key(x)
            if k in self.v:
                return _cast(self.v[k], x.dtype)
            r = self._shadow_view(x, k)
            if r is not None:
                with self.host():
                    if r.numel() >= 1:
                        flat = r.flatten()
                        if bool((flat == flat[0]).all()):
                            return flat[0].item()
                return UNKNOWN
            c = getattr(x, "constant", None)
            if c is not None and c.numel() >= 1:
                with self.host():
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
            self.shadow.pop(k, None)

    def presuming(self, fn, value, warn, why, device=None):
        """`fn`, whose fake result (on `device` when given) gets `value` when the run does
        not know it: a check the program's data would decide (libs.py and api.py say which
        and why), each presumption counted in the warnings as `why`."""
        FT = self.FakeTensor

        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            if isinstance(out, FT) and (device is None or out.device.type == device) and \
                    self.known(out) is None:
                self.presume(out, value)
                warn(why)
            return out

        return call

    def _shadow_view(self, x, k):
        flat = self.shadow.get(k)
        if flat is None or flat.dtype != x.dtype:
            return None
        try:
            with self.host():
                return flat.as_strided(x.shape, x.stride(), x.storage_offset())
        except RuntimeError:  # a view past the storage the shadow was made for
            return None

    def _knowable(self, x):
        """Whether _real(x) would give x's values (without making a shadow)."""
        if not isinstance(x, self.FakeTensor):
            return x.device.type == "cpu"
        k = self.key(x)
        if k is None:
            return False
        if self._shadow_view(x, k) is not None or getattr(x, "constant", None) is not None:
            return True
        return k in self.v and \
            x.untyped_storage().nbytes() // max(x.element_size(), 1) <= SHADOW_LIMIT

    def _real(self, x):
        """`x` as a real host tensor of its values, made a shadow if it was only uniform;
        None when they are unknown or the storage is over the limit."""
        if not isinstance(x, self.torch.Tensor):
            return x
        if not isinstance(x, self.FakeTensor):
            return x if x.device.type == "cpu" else None
        k = self.key(x)
        if k is None:
            return None
        r = self._shadow_view(x, k)
        if r is not None:
            return r
        c = getattr(x, "constant", None)
        if c is not None:
            return c
        if k not in self.v:
            return None
        n = x.untyped_storage().nbytes() // max(x.element_size(), 1)
        if n > SHADOW_LIMIT:
            return None
        with self.host():
            self._keep(k, self.torch.full((n,), self.v[k], dtype=x.dtype))
            return self._shadow_view(x, k)

    def _host_call(self, func, args, kwargs, limit=None):
        """`func` run for real on its inputs' values (a tuple (result,)), or None when one is
        unknown or the call fails. A uniform input over SHADOW_LIMIT is given, up to `limit`
        elements, as its value expanded to its shape (no storage) instead of a shadow."""
        torch = self.torch
        from torch.utils._pytree import tree_flatten, tree_unflatten

        flat, spec = tree_flatten((args, kwargs))
        ts = [a for a in flat if isinstance(a, torch.Tensor)]
        if not all(self._knowable(a) or self._uniform_up_to(a, limit) for a in ts):
            return None  # before any uniform value is made a shadow
        if len(self.shadow) > SHADOW_COUNT or self._elems > SHADOW_TOTAL:
            self._trim()
        real = []
        for a in flat:
            if isinstance(a, torch.device):
                a = torch.device("cpu")
            elif isinstance(a, torch.Tensor):
                a = self._real(a) if self._knowable(a) else self._expanded(a)
                if a is None:
                    return None
            real.append(a)
        rargs, rkwargs = tree_unflatten(real, spec)
        try:
            with self.host():
                return (func(*rargs, **rkwargs),)
        except Exception:  # noqa: BLE001 - any failure only means "unknown"
            return None

    def _uniform_up_to(self, x, limit):
        return limit is not None and isinstance(x, self.FakeTensor) and \
            self.key(x) in self.v and x.numel() <= limit

    def _expanded(self, x):
        with self.host():
            return self.torch.full((), self.v[self.key(x)], dtype=x.dtype).expand(x.shape)

    def host_result(self, func, args, kwargs, limit):
        """The real result of `func` on its inputs' values, inputs of up to `limit` elements;
        None when a value is unknown. For the ops whose output size is the data's (datadep)."""
        r = self._host_call(func, args, kwargs, limit)
        return None if r is None else r[0]

    def host_values(self, x, limit):
        """Fake tensor `x`'s values as a host tensor (a shadow, a constant, or its uniform
        value expanded, up to `limit` elements), or None when they are unknown."""
        if not isinstance(x, self.FakeTensor):
            return None
        if self._knowable(x):
            return self._real(x)
        return self._expanded(x) if self._uniform_up_to(x, limit) else None

    def _run_shadow(self, func, args, kwargs, outs):
        """Run `func` for real on its inputs' values and keep the values of `outs` (the
        storages it wrote); False when that is not possible."""
        torch = self.torch
        if torch.Tag.nondeterministic_seeded in func.tags or \
                func.overloadpacket.__name__ in _NO_SHADOW:
            return False
        for o in outs:
            if o.untyped_storage().nbytes() // max(o.element_size(), 1) > SHADOW_LIMIT:
                return False
        r = self._host_call(func, args, kwargs)
        if r is None:
            return False
        res = r[0]
        rs = res if isinstance(res, (tuple, list)) else (res,)
        rs = [r for r in rs if isinstance(r, torch.Tensor)]
        if func._schema.is_mutable:
            return True  # written in place, through the shadows' views
        if len(rs) != len(outs):
            return False
        for o, r in zip(outs, rs):
            k = self.key(o)
            if k is None or r.dtype != o.dtype or tuple(r.shape) != tuple(o.shape):
                continue
            n = o.untyped_storage().nbytes() // max(o.element_size(), 1)
            buf = torch.zeros((n,), dtype=o.dtype)
            buf.as_strided(o.shape, o.stride(), o.storage_offset()).copy_(r)
            self._keep(k, buf)
            self.v.pop(k, None)
        return True

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

        def cmp(f, equality=False):
            known = both(f)

            def r(a, kw):
                v = known(a, kw)
                if v is not K or len(a) < 2 or not isinstance(a[1], (int, float)) or \
                        isinstance(a[1], bool) or not isinstance(a[0], self.FakeTensor):
                    return v
                # bounded values against a number: <, <=, >, >= are monotone, so decided
                # when both ends agree; ==, != only for a number outside the bounds
                b = self.bounds.get(self.key(a[0]))
                if b is None:
                    return K
                lo, hi = b
                y = a[1]
                if equality:
                    return f(lo, y) if lo == hi or y < lo or y > hi else K
                return f(lo, y) if f(lo, y) == f(hi, y) else K
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
            "eq": cmp(lambda x, y: x == y, True), "ne": cmp(lambda x, y: x != y, True),
            "lt": cmp(lambda x, y: x < y), "le": cmp(lambda x, y: x <= y),
            "gt": cmp(lambda x, y: x > y), "ge": cmp(lambda x, y: x >= y),
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
            pending = []
            for t in targets:
                k = self.key(t)
                if k is None:
                    continue
                self.bounds.pop(k, None)
                v = rule(args, kwargs) if rule is not None else UNKNOWN
                st = t.untyped_storage()
                whole = t.numel() * t.element_size() == st.nbytes()
                old = self.v.get(k, UNKNOWN)
                if v is not UNKNOWN and (whole or (old is not UNKNOWN and old == v)):
                    self.v[k] = _cast(v, t.dtype)
                    self.shadow.pop(k, None)
                elif t.device.type == "cpu" and getattr(t, "constant", None) is not None:
                    # fake mode keeps a CPU tensor's constant itself (and has written it)
                    self.v.pop(k, None)
                    self.shadow.pop(k, None)
                else:
                    pending.append((t, k, whole))
            if pending:
                # A write the rules cannot name: run it on the shadows. A target wholly
                # overwritten (copy_, an out= overload) needs no values of its own.
                ok = True
                for t, k, whole in pending:
                    if self._shadow_view(t, k) is None and k not in self.v and \
                            getattr(t, "constant", None) is None:
                        if whole and (name == "copy_" or func._overloadname == "out"):
                            self._blank(t, k)
                        else:
                            ok = False
                ok = ok and self._run_shadow(func, args, kwargs, [t for t, _, _ in pending])
                for t, k, _ in pending:
                    self.v.pop(k, None)
                    if not ok:
                        self.shadow.pop(k, None)
            return
        if isinstance(out, FT):
            outs = (out,)
        elif isinstance(out, (tuple, list)):
            outs = [o for o in out if isinstance(o, FT)]
            if name in ("max", "min") and len(outs) == 2 and rule is not None and \
                    rule(args, kwargs) is not UNKNOWN:  # (values, indices): the indices unknown
                outs = outs[:1]
                self._forget(out[1] if isinstance(out[1], FT) else None, args)
        else:
            return
        in_keys = {self.key(a) for a in args if isinstance(a, FT)}
        fresh = [o for o in outs if self.key(o) is not None and self.key(o) not in in_keys]
        if not fresh:
            return  # views: they share their base's value
        b = self._bounds_of(func, name, args)
        for o in fresh:
            if b is not None and o.dtype != self.torch.bool and not (
                    o.dtype.is_floating_point and max(abs(b[0]), abs(b[1])) > 2048):
                # (a cast to a float that rounds them could step outside)
                self.bounds[self.key(o)] = b
            else:
                self.bounds.pop(self.key(o), None)
        v = rule(args, kwargs) if rule is not None else UNKNOWN
        if v is not UNKNOWN and not (isinstance(v, float) and math.isnan(v)):
            for o in fresh:
                k = self.key(o)
                self.v[k] = _cast(v, o.dtype)
                self.shadow.pop(k, None)
            return
        for o in fresh:
            self.v.pop(self.key(o), None)
            self.shadow.pop(self.key(o), None)
        if len(fresh) == len(outs) and all(getattr(o, "constant", None) is None for o in outs):
            self._run_shadow(func, args, kwargs, list(outs))

    def _bounds_of(self, func, name, args):
        """Bounds of an op's output values: randint's range, or its input's for an op that
        only moves values (a copy, a cast, a gather)."""
        if name in ("randint", "randint_like"):
            ov = func._overloadname
            if name == "randint":
                lo, hi = (args[0], args[1]) if ov.startswith("low") else (0, args[0])
            else:
                lo, hi = (args[1], args[2]) if ov.startswith("low") else (0, args[1])
            ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi))
            return (lo, hi - 1) if ok and hi > lo else None
        if name in _MOVES_VALUES and args and isinstance(args[0], self.FakeTensor):
            return self.bounds.get(self.key(args[0]))
        return None

    def _keep(self, k, buf):
        self.shadow[k] = buf
        self._elems += buf.numel()

    def _trim(self):
        """Forget the oldest half of the shadows: a long trace keeps its host memory bounded
        (SHADOW_COUNT shadows, SHADOW_TOTAL elements); what is forgotten is only unknown."""
        for k in list(self.shadow)[:len(self.shadow) // 2]:
            del self.shadow[k]
        self._elems = sum(t.numel() for t in list(self.shadow.values()))

    def _blank(self, t, k):
        n = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        if n <= SHADOW_LIMIT:
            self._keep(k, self.torch.zeros((n,), dtype=t.dtype))

    def _forget(self, t, args):
        if t is not None:
            k = self.key(t)
            if k is not None:
                self.v.pop(k, None)
                self.shadow.pop(k, None)
