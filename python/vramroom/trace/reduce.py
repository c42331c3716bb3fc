"""The global-memory staging of PyTorch's CUDA reductions (ATen's Reduce.cuh).

A reduction whose inputs per output are many, and whose outputs are few enough to leave SMs
idle, splits each output's inputs across several CTAs (`ctas_per_output`), which combine
their partial results through a buffer and per-block semaphores that `gpu_reduce_kernel`
takes from the caching allocator, after the op's output, and gives back when it returns:
the buffer, then the semaphores, freed semaphores first. Training meets it in every bias
gradient (`grad.sum(0)` over batch x tokens rows): 16-64 MiB buffers in BERT's backward.

`outer_staging` follows `setReduceConfig` for the one layout modelled: a contiguous input
reduced over its leading dims (M rows) into its trailing ones (N outputs), float
accumulation. Checked against real H100 snapshots (M = 1024 and 4096 rows, N = 512, 2048,
8192: buffer 4 x N x ctas x 128 bytes, semaphores N / 32 bytes). Reductions over trailing or
scattered dims, and integer or complex ones, are not modelled (their buffers are small: a few
bytes per output).
"""

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
    """(buffer bytes, semaphore bytes) of reducing M leading rows into N outputs, or None
    when the reduction stays inside its blocks."""
    if M <= 1 or N <= 0:
        return None
    vec = 4
    while N % vec:
        vec //= 2
    dim0, dim1 = N // vec, M
    max_threads = MAX_REDUCE_THREADS // vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    bw = min(d0, WARP)
    bh = min(d1, max_threads // bw)
    bw = min(d0, max_threads // bh)
    step_out, step_in = bw, 1
    split_warps = M >= min(bh * 16, 256)
    if split_warps:
        step_in *= bh
    else:
        step_out *= bh
    vpt = _ceil(M, step_in)
    target = sms * (threads_per_sm // (bw * bh))
    grid_x = _ceil(N // vec, step_out)
    ctas = 1
    if split_warps and vpt >= 256 and grid_x <= target:
        ctas = max(min(_ceil(target, grid_x), _ceil(vpt, 16)), _ceil(vpt, 256))
    if ctas <= 1:
        return None
    return arg_size * N * ctas * bw * vec, 4 * grid_x


def staging(x, dims, gpu):
    """The staging of aten.sum/mean over `dims` of fake cuda tensor `x` on `gpu`, or None."""
    import torch

    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        return None
    if not x.is_contiguous() or x.numel() == 0 or x.dim() == 0:
        return None
    nd = x.dim()
    red = sorted({d % nd for d in dims}) if dims else list(range(nd))
    shape = list(x.shape)
    # leading dims reduced, trailing kept (size-1 dims may sit anywhere)
    real = [i for i in range(nd) if shape[i] != 1]
    kept = [i for i in real if i not in red]
    reduced = [i for i in real if i in red]
    arg = 8 if x.dtype == torch.float64 else 4
    if reduced and not kept:
        # everything into one value (loss.mean(), x.pow(2).sum()): split across blocks
        # when each thread would sum 256 or more (ho_gather_scatter_einsum's mean: 313
        # blocks' partials, 1252 bytes, and a semaphore; multinomial's max and min)
        return full_reduce_staging(x.numel(), gpu.multi_processor_count, arg,
                                   gpu.max_threads_per_sm)
    if not kept or not reduced or max(reduced) > min(kept):
        return None
    M = 1
    for i in reduced:
        M *= shape[i]
    N = 1
    for i in kept:
        N *= shape[i]
    return outer_staging(M, N, arg, gpu.multi_processor_count, gpu.max_threads_per_sm)


def full_reduce_staging(numel, sms, acc=4, threads_per_sm=2048):
    """(buffer, semaphores) bytes of a reduction of numel contiguous values to one, or None
    (Reduce.cuh's setReduceConfig for one output: 512 threads; the input split across blocks
    when each thread would sum 256 or more)."""
    vpt = -(-numel // 512)
    if vpt < 256:
        return None
    ctas = max(min(sms * (threads_per_sm // 512), -(-vpt // 16)), -(-vpt // 256))
    return ctas * acc, 4
