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

What CUDA allocates around them (device run 47, ops/measure.py --set run47: 139 calls of
nonzero, masked_select, x[mask], unique, unique_consecutive, repeat_interleave and bincount
on inputs whose count was known by construction) comes back as hidden.py's event tokens.
nonzero: a 4-byte count, cub's reduce scratch (1 byte up to 4,096 elements, 21,503 from
32,768; unmeasured between, taken as the larger), the output (count x dims x 8, none for
none), cub's select scratch (1,023 bytes up to 65,536 elements, then on the line through the
measured sizes), freed, then the count. masked_select and x[mask] run that nonzero over the
mask (broadcast to the data; a copy first where that is not contiguous) into a transient, then
the output, then free it; an accumulating index_put_ over a mask (x[mask]'s backward) frees it
once the linear index is made, before its sort (sorting.index_put_acc_tokens). unique sorts a
copy (cub's keys-only radix sort: the alternate buffer, 2 KiB of bins a key byte, 511, 1 KiB
a tile of 5,760 int64 or 6,912 4-byte keys; pairs with the positions for return_inverse) and
its values and counts keep storages of the input's length, however few values are unique,
as unique_consecutive's do; repeat_interleave scans the repeats (cub's scan scratch) and
checks them (a bool per repeat, all()'s staging); bincount reads min and max (each with a
full reduction's staging).
"""

from .hidden import value_at
from .sorting import _a, cub_scan, cub_single_tile, cub_sort_pairs

HOST_LIMIT = 1 << 26

# run for real on the host: every input decides the output's size
_HOST_RUN = frozenset(("_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
                       "_unique", "repeat_interleave", "bincount"))


def known_outputs(vals, func, args, kwargs, empty, sms):
    """(fake outputs, hidden.py tokens around them, [] where unmeasured: the outputs alone)
    for data-dependent `func` from the known values that decide their sizes, made by
    `empty(shape, dtype, device)`; None when such a value is unknown. `sms`: the GPU's SM
    count (reduction staging). x[mask] reaches here as the nonzero inside aten.index (its
    tokens: mask_index_tokens)."""
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
        n = int(m.count_nonzero())
        return (empty((n, args[0].dim()), torch.int64, device),
                nonzero_tokens(args[0].numel(), n > 0))
    if name == "masked_select":
        x, mask = args[0], args[1]
        m = vals.host_values(mask, HOST_LIMIT)
        if m is None:
            return None
        shape = torch.broadcast_shapes(tuple(x.shape), tuple(mask.shape))
        n = int(m.expand(shape).count_nonzero())
        full = mask.expand(shape)
        return (empty((n,), x.dtype, device),
                through_nonzero(full.numel(), n * full.dim() * 8, _copy_bytes(full)))
    if name not in _HOST_RUN:
        return None
    real = vals.host_result(func, args, kwargs, HOST_LIMIT)
    if real is None:
        return None
    n_in = args[0].numel() if isinstance(args[0], torch.Tensor) else 0
    keep_input_length = name in ("_unique2", "unique_consecutive")

    def fake(r):
        if not isinstance(r, torch.Tensor):
            return r
        if keep_input_length and r.dim() == 1 and 0 < r.numel() < n_in:
            # unique's values and counts: storages of the input's length, resized down
            return empty((n_in,), r.dtype, device)[:r.numel()]
        return empty(tuple(r.shape), r.dtype, device)

    out = tree_map(fake, real)
    return out, host_run_tokens(name, func, args, kwargs, real, sms) or []


def known_mask(vals, t):
    """(count, (elements, nonzero's bytes, contiguous copy's bytes)) of a bool mask whose
    values the trace knows: its nonzero's sizes, as nonzero_kept takes them; None when
    unknown."""
    m = vals.host_values(t, HOST_LIMIT)
    if m is None:
        return None
    count = int(m.count_nonzero())
    return count, (t.numel(), count * t.dim() * 8, _copy_bytes(t))


def _copy_bytes(t):
    # nonzero reads a contiguous mask: an expanded or broadcast one is copied first
    return 0 if t.is_contiguous() else t.numel() * t.element_size()


def mask_index_tokens(vals, args):
    """Tokens of x[mask] (aten.index with one bool mask and no other index) whose mask the
    trace knows, or None: the nonzero inside it ran nested, sized, but not recorded."""
    import torch

    idx = [i for i in (args[1] if len(args) > 1 else ()) if i is not None]
    if len(idx) != 1 or not isinstance(idx[0], torch.Tensor) or \
            idx[0].dtype not in (torch.bool, torch.uint8):
        return None
    known = known_mask(vals, idx[0])
    return None if known is None else through_nonzero(*known[1])


# cub's select scratch over n flags (nonzero's second pass, unique's run-length pass)
_SELECT = [(65536, 1023), (524288, 1791), (1000000, 2815), (4194304, 8959),
           (6000000, 12287), (10000000, 19711)]


def _count_scratch(n):
    return 1 if n <= 4096 else 21503


def _select_scratch(n):
    return 1023 if n <= 65536 else value_at(_SELECT, n)


def nonzero_tokens(n, any_true):
    """Tokens of nonzero over n elements, its output the one "o" (none when all false)."""
    return ([["t", 4], ["t", _count_scratch(n)], ["f", 1]] + ([["o", 0]] if any_true else []) +
            [["t", _select_scratch(n)], ["f", 2], ["f", 0]] + ([] if any_true else [["oi", 0]]))


def nonzero_kept(n, nz_bytes, mask_copy=0):
    """Tokens of the nonzero that indexing runs over an n-element mask, its result (nz_bytes)
    kept as a transient: (tokens, transients made, the result's index). A mask that is not
    contiguous (expanded, broadcast) is first copied (mask_copy bytes), freed once its count
    is read (device run 47's masked LM: an expanded [B, T] mask, 8,192 bytes)."""
    t = [["t", mask_copy]] if mask_copy else []
    c = len(t)
    t += [["t", 4], ["t", _count_scratch(n)], ["f", c + 1], ["t", nz_bytes],
          ["t", _select_scratch(n)], ["f", c + 3], ["f", c]]
    if mask_copy:
        t.append(["f", 0])
    return t, c + 4, c + 2


def through_nonzero(n, nz_bytes, mask_copy=0):
    """masked_select / x[mask]: nonzero over the n-element mask into a transient of
    nz_bytes, the output, then the transient freed."""
    t, _, nz = nonzero_kept(n, nz_bytes, mask_copy)
    return t + [["o", 0], ["f", nz]]


def _sort_keys_scratch(n, key):
    if cub_single_tile(n, key, key):
        return 1
    tile = {8: 5760}.get(key, 6912)
    return _a(n * key) + key * 2048 + 511 + 1024 * -(-n // tile)


def host_run_tokens(name, func, args, kwargs, real, sms):
    """Tokens of the ops run on the host's values (unique, repeat_interleave, bincount), in
    the order of their outputs; None for a form not measured (the outputs alone)."""
    import torch

    from .reduce import full_reduce_staging

    x = args[0]
    n = x.numel()
    if name == "_unique2":
        e = x.element_size()
        inverse = bool(args[2]) if len(args) > 2 else bool(kwargs.get("return_inverse"))
        counts = bool(args[3]) if len(args) > 3 else bool(kwargs.get("return_counts"))
        if counts and n > 10000:
            run = value_at([(10000, 1023), (1000000, 21759)], n)
        elif e < 8 and n > 10000:  # 4-byte keys: measured at 1M (float32)
            run = value_at([(10000, 1023), (1000000, 2047)], n)
        else:
            run = _select_scratch(n)
        # outputs (values, inverse, counts), by index: those not asked for are empty
        if not inverse:
            t = [["t", n * e], ["t", _sort_keys_scratch(n, e)], ["f", 1], ["oi", 0],
                 ["t", 8]] + ([["oi", 2]] if counts else []) + \
                [["t", run], ["f", 3], ["f", 2], ["f", 0], ["oi", 1]]
            return t + ([] if counts else [["oi", 2]])
        pairs = 1 if cub_single_tile(n, e, 8) else cub_sort_pairs(n, e, 8)
        scan = 1023 if n <= 10000 else value_at([(10000, 1023), (1000000, 3583)], n)
        t = [["t", n * e], ["t", n * 8], ["t", n * 8], ["t", pairs], ["f", 3], ["f", 1],
             ["oi", 0], ["t", n * 8], ["t", scan], ["f", 5], ["f", 4], ["oi", 1], ["t", 8]] + \
            ([["oi", 2]] if counts else []) + [["t", run], ["f", 7], ["f", 6], ["f", 2], ["f", 0]]
        return t + ([] if counts else [["oi", 2]])
    if name == "unique_consecutive" and not any(args[1:3]) and not kwargs.get("return_inverse") \
            and not kwargs.get("return_counts"):
        return [["oi", 0], ["t", 8], ["t", _select_scratch(n)], ["f", 1], ["f", 0], ["oi", 1],
                ["oi", 2]]
    if name == "repeat_interleave" and func._overloadname == "Tensor" and \
            kwargs.get("output_size") is None and x.dtype == torch.int64:
        t = [["t", n * 8], ["t", cub_scan(n, 8)], ["f", 1], ["t", n], ["t", 1]]
        st = full_reduce_staging(n, sms, 1)
        if st:
            t += [["t", st[0]], ["t", st[1]], ["f", 5], ["f", 4]]
        return t + [["f", 3], ["f", 2], ["o", 0], ["f", 0]]
    if name == "bincount":
        st = full_reduce_staging(n, sms, 8 if x.element_size() == 8 else 4)
        t = []
        for _ in range(2):  # min, then max, each read by .item()
            i = sum(1 for k, _ in t if k == "t")
            t.append(["t", 8])
            if st:
                t += [["t", st[0]], ["t", st[1]], ["f", i + 2], ["f", i + 1]]
            t.append(["f", i])
        return t + [["o", 0]]
    return None
