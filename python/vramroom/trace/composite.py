"""Explicit composites: ops whose CUDA implementation is a C++ composite of other ops.

An op registered as CompositeExplicitAutograd (or its NonFunctional twin: logsumexp.out)
with no CUDA kernel of its own runs on the GPU as the at:: calls of that composite, each a
kernel with outputs of its own: logsumexp makes amax, abs, eq and exp(x - maxes) (the size
of x) before its sum; cdist's _euclidean_dist pow, sum, ones_like, two cats and a matmul;
isinf abs() == inf. A fake kernel makes the outputs alone, so the trace would miss those
temporaries. mode.py redispatches such an op to its composite (CUDA's key) with the
recording mode on, and the parts come back to it as the kernels they are.

Most explicit composites allocate nothing but their output (clone, constant_pad_nd,
masked_fill, _unsafe_view), and some cannot run on fake tensors at all (a composite that
reads a value, or makes a view by hand, which comes back as a plain meta tensor). So the
decision is made by running the composite once on meta copies of the arguments, under a
dispatch mode that sees every part (`probe`): an op is redispatched only where that run
succeeds and leaves a temporary, a tensor made by a part that is neither an output nor an
input. The answer is cached per op and argument signature (dtypes and ranks: isinf of an
integer tensor is zeros_like, of a float one abs() == inf). mode.py then tries the composite
once on the fake arguments with nothing recorded (`_dry_run`: `repeat` of a 0-dim tensor
needs its data) before the run that records; an op that mutates its arguments is tried only
inside a composite that passed (logsumexp's logsumexp.out).
"""

import torch

_STATIC = {}
_PROBED = {}


def _static(func, whole):
    """Whether func is an explicit composite with no CUDA kernel that no rule models whole,
    and not a view (nor returns one) or a *_like/new_* factory (their output is all they
    make); an out= overload (its return is its out argument, written) is one."""
    c = _STATIC.get(func)
    if c is None:
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        try:
            n = func.name()
            base = n.split("::")[-1].split(".")[0]
            c = (has(n, "CompositeExplicitAutograd") or
                 has(n, "CompositeExplicitAutogradNonFunctional")) and \
                not has(n, "CUDA") and not func.is_view and func not in whole and \
                not base.endswith("_like") and not base.startswith("new_") and \
                not any(r.alias_info is not None and not r.alias_info.is_write
                        for r in func._schema.returns)
        except Exception:  # noqa: BLE001 - an op the dispatcher does not know by name
            c = False
        _STATIC[func] = c
    return c


def _tensors(x):
    """The tensors in a nest of arguments or results."""
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _signature(args, kwargs):
    return tuple((str(t.dtype), t.dim(), t.device.type) for t in _tensors((args, kwargs)))


def probe(func, args, kwargs, whole):
    """Runs func's composite on meta copies of its arguments: True when a part makes a
    temporary, False when it makes none or the composite cannot run there. A part that is
    an explicit composite itself runs its own (logsumexp's logsumexp.out), as in the trace."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import TorchDispatchMode

    made = []

    class _Parts(TorchDispatchMode):
        def __torch_dispatch__(self, f, types, a=(), kw=None):
            if _static(f, whole):
                with self:
                    out = run(f, a, kw or {})
            else:
                out = f(*a, **(kw or {}))
            made.extend(_tensors(out))
            return out

    def meta(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype,
                                       device="meta")
        if isinstance(x, (list, tuple)):
            return type(x)(meta(v) for v in x)
        return x

    try:
        with unset_fake_temporarily():
            margs = meta(list(args))
            mkw = {k: meta(v) for k, v in kwargs.items()}
            with _Parts():
                out = run(func, margs, mkw)
    except Exception:  # noqa: BLE001 - a composite that needs values or a real device
        return False
    keep = {t.untyped_storage()._cdata for t in _tensors((margs, mkw, out))}
    return any(t.untyped_storage()._cdata not in keep and t.untyped_storage().nbytes()
               for t in made)


def redispatched(func, args, kwargs, whole):
    """Whether mode.py runs func's composite (see the module's notes)."""
    if not _static(func, whole):
        return False
    key = (func, _signature(args, kwargs))
    c = _PROBED.get(key)
    if c is None:
        c = _PROBED[key] = probe(func, args, kwargs, whole)
    return c


def run(func, args, kwargs):
    """func's composite, for the mode that is on to record its parts."""
    return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA), *args, **kwargs)
