"""The global-memory staging of PyTorch's CUDA reductions (ATen's Reduce.cuh).

A reduction whose inputs per output are many, and whose outputs are few enough to leave SMs
idle, splits each output's inputs across several CTAs (`ctas_per_output`), which combine
their partial results through a buffer and per-block semaphores that `gpu_reduce_kernel`
takes from the caching allocator, after the op's output, and gives back when it returns:
the buffer, then the semaphores, freed semaphores first. Training meets it in every bias
gradient (`grad.sum(0)` over batch x tokens rows): 16-64 MiB buffers in BERT's backward.

`iter_staging` follows `setReduceConfig` for any strided input: TensorIterator's layout
first (reduced dims moved innermost and sorted by the input's strides, kept dims by the
output's, then adjacent dims coalesced), then the block shape, the input split across lanes,
warps and CTAs, and the output vectorization. `outer_staging` (a contiguous input reduced
over its leading dims) and `full_reduce_staging` (everything into one value) name its two
most common cases. Checked against real H100 snapshots: M = 1024 and 4096
rows, N = 512, 2048, 8192 (buffer 4 x N x ctas x 128 bytes, semaphores N / 32 bytes); a
conv bias grad summed over a channels-last-strided grad (ViT's patch embedding: 19267584
and 24 bytes); Adafactor's norms.

The buffer holds one partial result (the kernel's `arg_t`) per output, CTA and lane, and
`partial_bytes` sizes it by family, as each reduction's CUDA kernel declares it: sums,
means and norms accumulate in float (double for doubles); amax/amin and max()/min() of
everything in the input's own type; var/std and their `_mean` twins carry Welford's
(mean, m2, int32 n, nf) in float (16 bytes; 32 for doubles); argmax/argmin and max/min
over a dim a (value, int64 index) pair (16 bytes); aminmax a (min, max) pair of the
input's type; all()/any() one byte. Integer and complex sums are not modelled (their
buffers are small: a few bytes per output).
"""

import math

MAX_REDUCE_THREADS = 512
WARP = 32


def _last_pow2(n):
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _ceil(a, b):
    return -(-a // b)


def outer_staging(M, N, arg_size, sms, threads_per_sm):
    """(buffer bytes, semaphore bytes) of reducing M leading rows of a contiguous [M, N] into
    N outputs, or None when the reduction stays inside its blocks."""
    if M <= 1 or N <= 0:
        return None
    return iter_staging([M, N], [N, 1], [0], 0, sms, threads_per_sm, arg_size)


def partial_bytes(family, dtype):
    """Bytes of one partial result of a reduction `family` over `dtype`, or None where it is
    not modelled: "acc" (sum, mean, norm), "logical" (all, any), "same" (amax, amin, max,
    min), "welford" (var, std, var_mean, std_mean), "argpair" (argmax, argmin, max.dim,
    min.dim), "minmax" (aminmax)."""
    if dtype.is_complex:
        return None
    if family == "logical":
        return 1
    if family == "argpair":
        return 16
    if family == "same":
        return dtype.itemsize
    if family == "minmax":
        return 2 * dtype.itemsize
    if not dtype.is_floating_point or dtype.itemsize == 1:
        return None
    wide = dtype.itemsize == 8
    if family == "welford":
        return 32 if wide else 16
    return 8 if wide else 4


def staging(x, dims, gpu, family="acc"):
    """The staging of a reduction of `family` (partial_bytes) over `dims` (all when empty) of
    fake cuda tensor `x` on `gpu`, or None (bart's `isfinite(h).all()` over 294,912 values,
    "logical": 36 and 4 bytes in hq_bart_beam_fp16's real run)."""
    if x.numel() == 0 or x.dim() == 0:
        return None
    nd = x.dim()
    red = sorted({d % nd for d in dims}) if dims else list(range(nd))
    return layout_staging(x.shape, x.stride(), x.storage_offset(), x.dtype, red, gpu, family)


def layout_staging(shape, strides, offset, dtype, red, gpu, family="acc"):
    """`staging` for a tensor given by its layout (a conv's bias grad over its grad_output,
    as laid out or as cuDNN's contiguous copy would be)."""
    arg = partial_bytes(family, dtype)
    if arg is None:
        return None
    return iter_staging(list(shape), list(strides), list(red), offset,
                        gpu.multi_processor_count, gpu.max_threads_per_sm, arg)


def full_reduce_staging(numel, sms, acc=4, threads_per_sm=2048):
    """(buffer, semaphores) bytes of a reduction of numel contiguous values to one, or None
    (one output: 512 threads; the input split across blocks when each thread would sum 256
    or more)."""
    return iter_staging([numel], [1], [0], 0, sms, threads_per_sm, acc)


def _iter_layout(shape, strides, red):
    """TensorIterator's (shape, input strides, output strides) for reducing `red` of a tensor
    of `shape` and element `strides`, innermost first: reorder_dimensions (reduced dims to
    the front, then by stride, operand by operand: the output, contiguous over the kept
    dims, before the input) and coalesce_dimensions."""
    nd = len(shape)
    out = [0] * nd
    acc = 1
    for i in range(nd - 1, -1, -1):
        if i not in red:
            out[i] = acc
            acc *= shape[i]
    ops = (out, list(strides))

    def should_swap(d0, d1):
        for k, st in enumerate(ops):
            s0, s1 = st[d0], st[d1]
            if k == 0 and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(nd - 1, -1, -1))
    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    sh = [shape[p] for p in perm]
    st = [[o[p] for p in perm] for o in ops]
    prev = 0
    for d in range(1, nd):
        if sh[prev] == 1 or sh[d] == 1 or all(sh[prev] * o[prev] == o[d] for o in st):
            if sh[prev] == 1:
                for o in st:
                    o[prev] = o[d]
            sh[prev] *= sh[d]
        else:
            prev += 1
            if prev != d:
                for o in st:
                    o[prev] = o[d]
                sh[prev] = sh[d]
    n = prev + 1 if nd else 0
    return sh[:n], st[1][:n], st[0][:n]


def iter_staging(shape, strides, red, offset, sms, threads_per_sm, arg_size=4,
                 input_vec_size=4):
    """(buffer bytes, semaphore bytes) gpu_reduce_kernel takes for reducing dims `red` of a
    tensor of `shape`, element `strides` and storage `offset`, or None when every output
    stays inside its blocks (setReduceConfig, Reduce.cuh)."""
    numel = math.prod(shape)
    if numel == 0 or not shape:
        return None
    sh, ist, ost = _iter_layout(list(shape), list(strides), set(red))
    nd = len(sh)
    nred = sum(1 for s in ost if s == 0)
    num_outputs = math.prod(s for s, o in zip(sh, ost) if o != 0)
    ipo = numel // max(num_outputs, 1)
    if nd == 0:
        return None
    fastest = nred == nd or ist[0] < ist[nred]
    if fastest:
        dim0, dim1, fms = ipo, num_outputs, ist[0]
    else:
        dim0, dim1, fms = num_outputs, ipo, ist[nred]
    out_vec = 1
    if fms == 1:
        if fastest and dim0 > 128 and nred == 1 and 4 >= input_vec_size:
            dim0 //= input_vec_size
        elif not fastest:
            out_vec = 4
            for n in [offset, sh[nred]] + [s for j, s in enumerate(ist) if j != nred]:
                while n % out_vec:
                    out_vec //= 2
            dim0 //= out_vec
    mnt = MAX_REDUCE_THREADS // out_vec
    d0 = _last_pow2(dim0) if dim0 < mnt else mnt
    d1 = _last_pow2(dim1) if dim1 < mnt else mnt
    bw = min(d0, WARP)
    bh = min(d1, mnt // bw)
    bw = min(d0, mnt // bh)
    step_in = step_out = 1
    block_x_reduce = fastest
    if fastest:
        step_in *= bw
    else:
        step_out *= bw
    split_warps = _ceil(ipo, step_in) >= min(bh * 16, 256)
    if split_warps:
        step_in *= bh
    else:
        step_out *= bh
    vpt = _ceil(ipo, step_in)
    target = sms * (threads_per_sm // (bw * bh))
    grid_x = _ceil(num_outputs // out_vec, step_out)
    if not (split_warps and vpt >= 256 and grid_x <= target):
        return None
    ctas = max(min(_ceil(target, grid_x), _ceil(vpt, 16)), _ceil(vpt, 256))
    if ctas <= 1:
        return None
    size = arg_size * num_outputs * ctas
    if not block_x_reduce:
        size *= bw * out_vec
    return size, 4 * grid_x
