"""What CUDA's sort, topk and cumsum allocate besides their outputs, as event tokens (see
hidden.Hidden.replay_tokens): cub's radix-sort and scan scratch and the index buffers of
PyTorch 2.11's segmented sorts, which fake tensors do not show.

Measured on an H100 (scripts/trace_corpus/ops/measure.py, device run 26: 468 calls; a test
checks every sort, topk and cumsum call of ops-h100-run26.json against these rules):
- sort over a dim of n <= 4096: the values and indices, then an 8n index buffer, freed.
- sort over more: with N elements in S slices, after the outputs
  - one slice, or slices of a million or more: an 8n index buffer, then each slice's cub
    radix-sort scratch (allocated and freed per slice);
  - fewer than 128 slices: two 8N (index, slice) buffers, the sorted keys (N x key), the
    radix sort's scratch, then a one-pass keys-only sort's scratch;
  - else: an 8N index buffer and cub's segmented sort scratch (both alternate buffers).
  The dim must be the innermost contiguous one; otherwise PyTorch copies the input and
  both outputs first, which was not measured, and the op is refused.
- topk: nothing, unless the multi-block radix select runs (PyTorch's should_use_multiblock
  on the slice count and size): then per-slice k-th values, two counters of 8 bytes a slice,
  per-block digit counts (512 bytes a block), per-slice digit sums (1 KiB), two per-block
  counters and two cub scans' scratch, all freed. Blocks per slice follow PyTorch's
  items-per-thread rule from the GPU's SM count. A sorted topk of more than 4096 was not
  measured and is refused.
- cumsum (cumprod too: PyTorch runs the same code with another operator): the input
  converted to the result's dtype first when it differs (bool and
  integers accumulate in int64); a single scan over the whole tensor adds cub's scan
  scratch (8-byte tile states over tiles of 1920 for 4-byte values, 16-byte over 896 for
  8-byte ones; 2-byte values were not measured and take the 4-byte rule).

- multinomial (p: R rows of C, float): without replacement or for one sample, PyTorch's
  checks and the exponential trick: max and min (full reductions, each with Reduce.cuh's
  staging when it splits: ceil(N/512) values a thread of 256 or more, ctas = max(min(4 an
  SM, ceil(vpt/16)), ceil(vpt/256)), 4 bytes each plus a 4-byte semaphore), `< inf`, `>= 0`
  and their `&` (kept to the end), then sum(1), `== 0` and its any (kept), a 1-byte check, the
  draw q (N x elem), and for several samples a values buffer and topk's scratch on q; with
  replacement and several samples: three N x elem buffers, and cub's scan scratch when R is
  1 (all 36 measured calls of device run 26 matched).
- index_put_(accumulate=True) with one int64 index tensor of n (an advanced-indexing
  backward, x[idx]'s): two bounds checks (8 and 1 bytes each, freed), then 8n buffers: two,
  the first freed, three more and cub's radix-sort scratch over the linear index (both
  alternate buffers, 2 KiB of bins per byte of the indexed size's bits, 511, 1 KiB per tile
  of 4608; one byte when cub sorts them in a single tile), freed last to first (all 36 calls of device run 26,
  V 1000 and 50000: two byte-passes; more bits are taken to need more passes, unmeasured).
  An indexed size of 256 or fewer rows sorts in one byte-pass, with no alternate buffers
  (device run 39: swin_t's position-bias table of 169 rows).
isin (elements, test elements) takes PyTorch's brute-force kernel while the test set is
small (fewer than 10 x numel(elements)^0.145): `out.copy_(elements.unsqueeze(-1).eq(test)
.any(-1))`, so the cross product's bools and the any's result come after the output and
go at the end of that expression, the later first (device run 26's beam search: three
allocations of the vocabulary's size a call, where the fake kernel makes one). Larger test
sets sort them (not measured: a warning).

cub's scratch for radix_sort_pairs(n keys of K bytes, 8-byte values) is both alternate
buffers, 256-aligned, K passes of 256 8-byte digit bins, 256 of counters, 255 of alignment
slack and 1 KiB of lookback per tile (tiles of 5632, 5376 and 4608 items for 2-, 4- and
8-byte keys). Up to one tile of cub's single-tile policy (256 threads of 19 items of 4 bytes,
fewer for wider keys or values: 2304 pairs of int64) it sorts in one block and asks for one
byte (device run 26: 1000 indices; run 28: transformers' MoE backward, 2048; 3073 and up
take the full scratch, embbwd/).
"""

from .reduce import full_reduce_staging

_TILE = {2: 5632, 4: 5376, 8: 4608}
SMALL_SORT = 4096
MAX_SORTED_TOPK = 4096


def _a(n):
    return (n + 255) // 256 * 256


def cub_single_tile(n, key, val=8):
    """Whether cub's radix sort of n pairs runs its single-tile kernel (one byte of scratch):
    AgentRadixSortDownsweepPolicy<256, 19> scaled to the wider of key and value."""
    return n <= 256 * max(1, 19 * 4 // max(4, key, val))


def cub_sort_pairs(n, key, val=8):
    """Scratch of cub's radix_sort_pairs over n keys of `key` bytes (None: unmeasured)."""
    tile = _TILE.get(key)
    if tile is None:
        return None
    return _a(n * key) + _a(n * val) + key * 2048 + 511 + 1024 * -(-n // tile)


def cub_sort_keys_one_pass(n):
    """Scratch of a one-pass keys-only radix sort of n int64 keys (the slice ids)."""
    return 2048 + 511 + 1024 * -(-n // 5760)


def cub_scan(n, elem):
    """Scratch of cub's single-pass scan over n values of `elem` bytes."""
    state, tile = (16, 896) if elem >= 8 else (8, 1920)
    return 511 + _a(state * (-(-n // tile) + 32))


def sort_tokens(shape, dim, key, innermost):
    """Tokens of aten.sort over `dim` of a tensor of `shape` with `key`-byte elements;
    `innermost`: the dim is the innermost of a contiguous tensor. Returns (tokens, why): why
    names an unmeasured case (tokens None)."""
    numel = 1
    for s in shape:
        numel *= s
    nsort = shape[dim] if shape else 1
    if numel == 0:
        return [["o", 0], ["o", 0]], None
    if nsort <= SMALL_SORT:
        return [["o", 0], ["o", 0], ["t", 8 * nsort], ["f", 0]], None
    if not innermost:
        return None, ("sort of more than %d elements over a dim that is not the innermost "
                      "contiguous one: PyTorch's copies of it were not measured" % SMALL_SORT)
    if numel >= 2 ** 31 - 1:
        return None, "sort of 2^31 elements or more: PyTorch's batched path was not measured"
    if cub_sort_pairs(1, key) is None:
        return None, "sort of %d-byte elements: cub's scratch for them was not measured" % key
    nseg = numel // nsort
    toks = [["o", 0], ["o", 0]]
    if nseg == 1 or nsort >= 1000000:
        toks.append(["t", 8 * nsort])
        for i in range(nseg):
            toks += [["t", cub_sort_pairs(nsort, key)], ["f", i + 1]]
        toks.append(["f", 0])
    elif nseg < 128:
        toks += [["t", 8 * numel], ["t", 8 * numel], ["t", key * numel],
                 ["t", cub_sort_pairs(numel, key)], ["f", 3], ["f", 2],
                 ["t", cub_sort_keys_one_pass(numel)], ["f", 4], ["f", 1], ["f", 0]]
    else:
        toks += [["t", 8 * numel], ["t", _a(key * numel) + _a(8 * numel) + 255], ["f", 1],
                 ["f", 0]]
    return toks, None


def use_multiblock(slices, size):
    """PyTorch 2.11's should_use_multiblock (TensorTopK.cpp)."""
    if slices > 2 ** 32 - 1 or size > 2 ** 32 - 1:
        return False
    return ((slices <= 20 and size >= 20000) or
            (20 < slices <= 40 and size >= 10000) or
            (40 < slices <= 80 and size >= 8000) or
            (80 < slices < 200 and size >= 5000) or
            (200 <= slices < 800 and size >= 3000) or
            (800 <= slices <= 4000 and size >= 800) or
            (slices > 4000 and size >= 400))


def topk_tokens(shape, dim, k, sorted_, elem, sms):
    """Tokens of aten.topk (values, indices); (None, why) where unmeasured."""
    numel = 1
    for s in shape:
        numel *= s
    size = shape[dim] if shape else 1
    if numel == 0 or size == 0:
        return [["o", 0], ["o", 0]], None
    if sorted_ and k > MAX_SORTED_TOPK:
        return None, ("a sorted topk of more than %d: PyTorch sorts it with at::sort, which "
                      "was not measured" % MAX_SORTED_TOPK)
    slices = numel // size
    if not use_multiblock(slices, size):
        return [["o", 0], ["o", 0]], None
    # items per thread: numel over the GPU's resident threads (6 blocks of 256 an SM at 40
    # registers a thread), clamped to [4, 64]
    ipt = max(4, min(64, -(-numel // (sms * 6 * 256))))
    blocks = slices * -(-size // (ipt * 256))
    toks = [["o", 0], ["o", 0], ["t", slices * elem], ["t", 8 * slices], ["t", 8 * slices],
            ["t", 512 * blocks], ["t", 1024 * slices], ["t", 4 * blocks], ["t", 4 * blocks],
            ["t", 1279], ["f", 7], ["t", 1279], ["f", 8]]
    toks += [["f", i] for i in (6, 5, 4, 3, 2, 1, 0)]
    return toks, None


def cumsum_tokens(numel, size, in_elem, out_elem, converts):
    """Tokens of aten.cumsum over a dim of `size` of a tensor of `numel` elements;
    `converts`: the input's dtype differs from the result's."""
    toks = [["o", 0]]
    n = 0
    if converts and numel:
        toks.append(["t", numel * out_elem])
        n += 1
    if numel and numel == size:
        toks += [["t", cub_scan(numel, out_elem)], ["f", n]]
    if converts and numel:
        toks.append(["f", 0])
    return toks if len(toks) > 1 else None


def isin_tokens(n_elements, n_test):
    """isin's allocations, or None on the (unmeasured) sorting path."""
    if n_elements == 0 or n_test == 0:
        return [["o", 0]]
    if n_test < int(10.0 * n_elements ** 0.145):
        return [["o", 0], ["t", n_elements * n_test], ["t", n_elements], ["f", 1], ["f", 0]]
    return None


class _Tokens:
    """Builds a token list: t() returns the transient's index for f()."""

    def __init__(self):
        self.toks, self.n = [["o", 0]], 0

    def t(self, size):
        self.toks.append(["t", size])
        self.n += 1
        return self.n - 1

    def f(self, i):
        self.toks.append(["f", i])


def randperm_tokens(n, elem):
    """Tokens of aten.randperm(n) on CUDA (Randperm.cu), its output of `elem`-byte integers:
    8 bytes made and freed, then arange(n) in the output's type, the random keys (int32
    below 2^24 elements) and their sorted copy, and cub's radix-sort scratch, freed last to
    first (device run 40: a PPO update's randperm(2048), one byte of scratch in cub's single
    tile). Returns (tokens, whether the scratch was measured): past one tile it is taken to
    be cub_sort_pairs', unmeasured."""
    b = _Tokens()
    if n <= 0:
        return b.toks, True
    key = 4 if n < (1 << 24) else 8
    one = b.t(8)
    b.f(one)
    single = cub_single_tile(n, key, elem)
    rng, keys, out = b.t(n * elem), b.t(n * key), b.t(n * key)
    scratch = b.t(1 if single else cub_sort_pairs(n, key, elem))
    for i in (scratch, out, keys, rng):
        b.f(i)
    return b.toks, single


def multinomial_tokens(rows, cols, n, replacement, elem, sms):
    """Tokens of aten.multinomial over `rows` distributions of `cols` (a 1-d input: one row),
    or None where its topk is not modelled."""
    numel = rows * cols
    b = _Tokens()
    if numel == 0:
        return b.toks
    acc = 8 if elem == 8 else 4
    if replacement and n > 1:
        bufs = [b.t(numel * elem) for _ in range(3)]
        if rows == 1:
            b.f(b.t(cub_scan(cols, elem)))
        for i in reversed(bufs):
            b.f(i)
        return b.toks

    def reduce_all(out):
        r = b.t(out)
        st = full_reduce_staging(numel, sms, acc)
        if st:
            s1, s2 = b.t(st[0]), b.t(st[1])
            b.f(s2)
            b.f(s1)
        return r

    mx = reduce_all(elem)
    lt = b.t(1)
    mn = reduce_all(elem)
    ge = b.t(1)
    valid = b.t(1)
    for i in (ge, mn, lt, mx):
        b.f(i)
    sm = reduce_all(rows * elem) if rows == 1 else b.t(rows * elem)
    zero = b.t(rows)
    anyz = b.t(1)
    b.f(zero)
    b.f(sm)
    b.f(b.t(1))
    q = b.t(numel * elem)
    if n > 1:
        vals = b.t(rows * n * elem)
        tk, _ = topk_tokens([rows, cols], 1, n, True, elem, sms)
        if tk is None:
            return None
        local = {}
        for k, v in tk:
            if k == "t":
                local[len(local)] = b.t(v)
            elif k == "f":
                b.f(local[v])
        b.f(vals)
    for i in (q, anyz, valid):
        b.f(i)
    return b.toks


def index_put_acc_tokens(n, size, n_outputs=1, checked=True, values_copy=0, n_index=1,
                         long_copies=(), permuted_copy=0, prefix=0, free_after_linear=()):
    """Tokens of an accumulating index_put_ (index_put_with_sort_kernel) over n (broadcast)
    indices whose linear index, divided by the slice, ranges over `size` values (checked:
    each index tensor's two bounds checks; autograd's index_backward passes unsafe=True).

    Per index tensor, in dim order (computeLinearIndex): the checks, its remainder and the
    remainder times the stride (8n each), the remainder freed; the first product is the
    linear index, each later one is added into it in place and freed. Before them, each
    int32 index tensor's int64 copy (long_copies), freed, in order, once the linear index is
    made. Then the values made contiguous at the indexed shape (values_copy: a gradient
    sliced by cat's backward, hs_gnn_index_train's h[src]), a contiguous copy of self when
    the indexed dims are not adjacent (permuted_copy), the sorted and original positions
    and arange (8n each) and cub's radix-sort scratch, all freed last to first, then the
    values copy and the linear index. The one-int64-index case is measured (36 calls); the
    rest follows the same source (PyTorch 2.11's Indexing.cu). `prefix` transients come
    before these tokens (a bool mask's nonzero, datadep.py); those in free_after_linear are
    freed with the int64 copies (the mask's index columns, device run 47)."""
    b = _Tokens()
    b.toks = [["o", 0]] * n_outputs
    b.n = prefix
    if n == 0:
        return b.toks
    if cub_single_tile(n, 8):
        scratch = 1
    else:
        # one byte-pass sorts from the keys straight into the output: no alternate
        # buffers (swin_t's relative-position-bias backward over a 169-row table: 3583
        # bytes for 2401 indices, device run 39)
        passes = max(1, -(-max(1, (size - 1).bit_length()) // 8))
        alt = 2 * _a(8 * n) if passes > 1 else 0
        scratch = alt + 2048 * passes + 511 + 1024 * -(-n // 4608)
    longs = [b.t(c) for c in long_copies]
    k = 8 * n
    linear = None
    for _ in range(n_index):
        if checked:
            for _ in range(2):
                i, j = b.t(8), b.t(1)
                b.f(j)
                b.f(i)
        rem, prod = b.t(k), b.t(k)
        b.f(rem)
        if linear is None:
            linear = prod
        else:
            b.f(prod)
    for i in list(longs) + list(free_after_linear):
        b.f(i)
    vals = b.t(values_copy) if values_copy else None
    perm = b.t(permuted_copy) if permuted_copy else None
    rest = [b.t(k), b.t(k), b.t(k), b.t(scratch)]
    for i in reversed(rest):
        b.f(i)
    for i in (perm, vals):
        if i is not None:
            b.f(i)
    b.f(linear)
    return b.toks
