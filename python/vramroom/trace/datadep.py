"""The ops whose output size is their data's (nonzero, masked_select, indexing with a bool
mask, unique, repeat_interleave, bincount), answered when the trace knows that data.

Design note. Fake mode cannot size these: their outputs depend on values it does not have
(DynamicOutputShapeException), so the trace refused them by name. But the values are often
known: a mask computed from an arange or from another known value, labels drawn by randint
checked against a bound they always meet (`labels >= 0`, DeBERTa's classification loss), a
uniform mask. values.py follows those. Only the values that decide the size are needed: a
mask's for nonzero, masked_select and indexing (the data beside it may stay unknown: the
size is the mask's count), every input's for unique, repeat_interleave and bincount, which run
for real on the host. The fake outputs get the real sizes, on the op's device. An input of
over HOST_LIMIT elements that is neither a shadow nor a constant is not read (its host copy
would be too big); a value the trace does not know leaves the refusal as it was: a count
guessed would be a peak guessed.
"""

HOST_LIMIT = 1 << 26

# run for real on the host: every input decides the output's size
_HOST_RUN = frozenset(("_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
                       "_unique", "repeat_interleave", "bincount"))


def known_outputs(vals, func, args, kwargs, empty, redispatch):
    """Fake outputs for data-dependent `func` from the known values that decide their sizes,
    made by `empty(shape, dtype, device)` (or the op run by `redispatch(func, args, kwargs)`
    on index tensors of the known size); None when such a value is unknown."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_flatten, tree_map

    name = func.overloadpacket.__name__
    fakes = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, FakeTensor)]
    if not fakes:
        return None
    device = fakes[0].device
    if name == "nonzero":
        m = vals.host_values(args[0], HOST_LIMIT)
        if m is None:
            return None
        return empty((int(m.count_nonzero()), args[0].dim()), torch.int64, device)
    if name == "masked_select":
        x, mask = args[0], args[1]
        m = vals.host_values(mask, HOST_LIMIT)
        if m is None:
            return None
        shape = torch.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
        return empty((int(m.expand(shape).count_nonzero()),), x.dtype, device)
    if name == "index" and len(args) > 1:
        # x[mask]: each bool (or uint8) mask stands for its nonzero's columns, index tensors
        # of its count; the data indexed need not be known
        new = []
        for ix in args[1]:
            if not isinstance(ix, torch.Tensor) or ix.dtype not in (torch.bool, torch.uint8):
                new.append(ix)
                continue
            m = vals.host_values(ix, HOST_LIMIT)
            if m is None:
                return None
            n = int(m.count_nonzero())
            new.extend(empty((n,), torch.int64, ix.device) for _ in range(ix.dim()))
        return redispatch(func, (args[0], new) + tuple(args[2:]), kwargs)
    if name not in _HOST_RUN:
        return None
    real = vals.host_result(func, args, kwargs, HOST_LIMIT)
    if real is None:
        return None

    def fake(r):
        return empty(tuple(r.shape), r.dtype, device) if isinstance(r, torch.Tensor) else r

    return tree_map(fake, real)
