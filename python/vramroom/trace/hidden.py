"""Allocations a CUDA run makes that fake tensors do not show: library workspaces taken from
the caching allocator inside kernels. The sizes come from one table, cuda_hidden.json (per
GPU architecture), and for cuDNN convolutions from the meta twin's measured table
(crates/vramroom-tensor/data/cudnn_workspaces_h200.json, same interpolation rule as
crates/vramroom-tensor/src/workspace.rs), read when this is a source checkout.

What each op adds (PyTorch 2.11's CUDA path):
- matmuls (mm, addmm, bmm, baddbmm, addmv, ...): the first one on a (thread, stream) pair
  allocates that cuBLAS handle's workspace, kept for the process; autograd's device thread
  has its own handle, so the first backward matmul pays again. The first matmul that goes
  through cuBLASLt (addmm with a 1-d bias and no size-1 matrix dimension: F.linear with
  bias, `_addmm_takes_lt`) adds the cuBLASLt workspace.
  Both come right after the op's output.
- convolution: forward allocates the output, then the algorithm's workspace, freed before
  returning; backward: grad_input, its workspace (freed), grad_weight, its workspace
  (freed), grad_bias.
- cuDNN attention forward: a small workspace freed at once (sdpa.py picks the backend); at
  a decode step over more than 512 keys, its split-KV workspace (cudnn_decode_workspace).
- SDPA's math path: `_safe_softmax`'s isneginf bools, their per-row all() and a 0-dim zero
  after its output; softmax's backward its `grad * output` after grad_input.
- embedding backward (embedding_dense_backward) over more than 3072 int64 indices: the sort
  path's index buffers and cub scratch around grad_weight, then either per-partial-segment
  sums or, for a small vocabulary with many indices per row, a dense accumulation
  (embedding_tokens; measured on an H100 by scripts/trace_corpus/embbwd/measure.py).
"""

import hashlib
import json
import math
import os
import threading

from .convnn import Neighbours, fixed_workspace
from .snapshot import WORKSPACE_TAG
from .sorting import cub_single_tile

_HERE = os.path.dirname(os.path.abspath(__file__))


def _addmm_takes_lt(activation, args, kwargs):
    """Whether addmm_out_cuda_impl takes cuBLASLt (isInputCompliesAddmmCudaLt, PyTorch 2.11
    with CUDA >= 12.1): beta 1; a contiguous bias that squeezes to 1-d over the output's
    columns (or, for _addmm_activation, any 2-d bias that broadcasts); a float type; and no
    size-1 dimension in mat2, which cublasLtMatmulAlgoGetHeuristic rejects. So a Linear with
    one output feature never takes the Lt workspace (hg_rnn3's head, Linear(128, 1), in
    device run 44), while one over a single row does: the 1 MiB workspace comes at the first
    batch-1 Linear in device runs 28 and 45 (hq_mobilenet_v2_infer_fp16_batches' classifier,
    hk_mlp_bs1_online_regression's first layer). Newer PyTorch also checks mat1's sizes."""
    import torch
    bias = args[0] if args else None
    m1 = args[1] if len(args) > 1 else kwargs.get("mat1")
    m2 = args[2] if len(args) > 2 else kwargs.get("mat2")
    if bias is None or m1 is None or m2 is None or m1.dim() != 2 or m2.dim() != 2:
        return False
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    out = kwargs.get("out")
    if beta != 1 or (out is not None and (out.dim() != 2 or not out.is_contiguous())):
        return False
    if m1.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        return False
    if min(m2.shape) <= 1:
        return False
    if bias.is_contiguous() and bias.dim() >= 1 and bias.squeeze().dim() == 1 and \
            bias.shape[-1] == m2.shape[1]:
        return True
    return activation and bias.dim() == 2 and all(
        b in (1, n) for b, n in zip(bias.shape, (m1.shape[0], m2.shape[1])))


CONV_ESTIMATED = ("a cuDNN convolution of a shape not measured for this GPU's architecture: its "
                  "workspace estimated from the nearest measured shape (convnn.py); "
                  "scripts/trace_corpus/conv/harvest_prog.py lists a program's, conv/measure.py "
                  "measures them on a GPU")
FFT_INTERPOLATED = ("a cuFFT plan at a batch between two measured ones: its work area on the "
                    "line between them (fft.py)")


def load_table():
    with open(os.path.join(_HERE, "cuda_hidden.json")) as f:
        return json.load(f)


def _conv_table(name):
    if not name:
        return {}
    cands = [
        os.path.join(_HERE, name),
        os.path.join(_HERE, "..", "..", "..", "crates", "vramroom-tensor", "data", name),
    ]
    for p in cands:
        if os.path.exists(p):
            with open(p) as f:
                d = json.load(f)
            t = {}
            for e in d["conv"]:
                key = (e["pass"], tuple(e["input"]), tuple(e["weight"]), tuple(e["stride"]),
                       tuple(e["padding"]), tuple(e["dilation"]), e["groups"])
                t[key] = sorted((b, n) for b, n in e["bytes"])
            return t
    return {}


def _conv_events(name):
    """The measured per-shape conv table (scripts/trace_corpus/conv/measure.py on a GPU of the
    architecture): key -> {batch: tokens}, tokens in the CUDA op's order: ["o", size] the next
    output, ["t", size] a transient, ["f", i] the free of the i-th transient."""
    if not name:
        return {}
    p = os.path.join(_HERE, name)
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        d = json.load(f)
    t = {}
    for e in d["entries"]:
        key = (e["pass"], tuple(e["input"]), tuple(e["weight"]), bool(e["bias"]),
               tuple(e["stride"]), tuple(e["padding"]), tuple(e["dilation"]),
               bool(e["transposed"]), tuple(e["output_padding"]), int(e["groups"]), e["dtype"],
               e.get("layout", "nchw"))
        # a config measured again at other batches (harvest_prog.py --beyond) adds points
        pts = dict(t.get(key, ()))
        pts.update((int(n), toks) for n, toks in e["by_batch"].items())
        t[key] = sorted(pts.items())
    return t


def _shape_of(toks):
    return [k if k != "f" else (k, v) for k, v in toks]


def value_at(points, n):
    """A measured size at n from sorted (n, bytes) points: exact at a measured n, on the
    line between two, scaled past the largest, the smallest's below it."""
    below = [p for p in points if p[0] <= n]
    above = [p for p in points if p[0] >= n]
    if below and below[-1][0] == n:
        return below[-1][1]
    if below and above:
        (n0, w0), (n1, w1) = below[-1], above[0]
        return int(round(w0 + (n - n0) / (n1 - n0) * (w1 - w0)))
    if below:
        n0, w0 = below[-1]
        return int(round(w0 * n / n0))
    return above[0][1]


def tokens_at(points, n):
    """The events at batch n from the measured batches: exact where measured; between two
    with the same events, each size on the line through them (a cuDNN algorithm's
    workspace is affine in the batch); past the largest, its transients scaled by n."""
    below = [p for p in points if p[0] <= n]
    above = [p for p in points if p[0] >= n]
    if below and below[-1][0] == n:
        return below[-1][1]
    if below and above:
        (n0, t0), (n1, t1) = below[-1], above[0]
        if _shape_of(t0) == _shape_of(t1):
            return [[k, v if k == "f" else int(round(v + (n - n0) / (n1 - n0) * (w - v)))]
                    for (k, v), (_, w) in zip(t0, t1)]
        # the algorithm changes between the two: the nearer one's events, scaled
        n0, t0 = (below[-1] if n - n0 <= n1 - n else above[0])
    else:
        n0, t0 = below[-1] if below else above[0]
    return [[k, v if k == "f" else int(round(v * n / n0))] for k, v in t0]


def shift_frees(toks, by):
    """toks with each free's transient index moved by `by` (placed after, or taken out of,
    a list whose transients come first)."""
    return [[k, v + by] if k == "f" else [k, v] for k, v in toks]


def split_backward(toks, grad_input_bytes):
    """A full conv backward's events as (input half, weight half), or None where they do not
    split safely: plain events only, the input's gradient (grad_input_bytes) made first. The
    weight half's frees are renumbered to its own transients."""
    if any(k not in ("o", "t", "f") for k, _ in toks) or not toks or \
            toks[0] != ["o", grad_input_bytes]:
        return None
    outs = [j for j, (k, _) in enumerate(toks) if k == "o"]
    if len(outs) < 2:
        return None
    first, second = toks[:outs[1]], toks[outs[1]:]
    temps = sum(1 for k, _ in first if k == "t")
    return first, shift_frees(second, -temps)


def with_grad_copies(toks, pas, grad_input_bytes, top, copy_in, copy_w, has_bias):
    """cudnn_convolution_backward's events (ConvShared.cpp) for a grad_output that is not
    dense, from the measured ones of a dense grad (toks), or None where they do not split:
    `top` bytes for grad_output.to(input's suggested format), made first and freed before
    the bias's grad (a copy only where the two suggested formats differ); else the input
    pass copies it after making grad_input (copy_in), and the weight pass before making
    grad_weight (copy_w), each freed when its pass ends. Frees count the transients of the
    whole list, as replay_tokens reads them."""
    if pas == "backward":
        halves = split_backward(toks, grad_input_bytes)
        if halves is None:
            return None
        first, second = halves
    elif pas == "backward_input_only":
        first, second = toks, []
    else:
        first, second = [], toks
    tail = []
    if has_bias and second and second[-1][0] == "o":
        second, tail = second[:-1], second[-1:]

    if first and copy_in:
        first = first[:1] + [["t", copy_in]] + shift_frees(first[1:], 1) + [["f", 0]]
    if second and copy_w:
        second = [["t", copy_w]] + shift_frees(second, 1) + [["f", 0]]
    body = first + shift_frees(second, sum(1 for k, _ in first if k == "t"))
    if top:
        body = [["t", top]] + shift_frees(body, 1) + [["f", 0]]
    return body + tail


def outputs_by_size(toks, sizes):
    """Measured events name outputs by their size in the order the kernel made them; where
    that is not the op's order (PyTorch's depthwise conv backward makes grad_weight before
    grad_input: hu_tv_shufflenet_train_sgd, device run 39), each "o" becomes ["oi", i], the
    op's output of that size. Unchanged where the sizes already follow the op's order or
    do not match one to one."""
    o_sizes = [v for k, v in toks if k == "o"]
    if len(o_sizes) != len(sizes) or o_sizes == sizes or sorted(o_sizes) != sorted(sizes) \
            or any(k in ("s", "oi") for k, _ in toks):
        return toks
    free = list(range(len(sizes)))
    out = []
    for k, v in toks:
        if k == "o":
            i = next(i for i in free if sizes[i] == v)
            free.remove(i)
            out.append(["oi", i])
        else:
            out.append([k, v])
    return out


def wrap_copy(toks, nbytes, outer, has_bias):
    """toks inside a copy of nbytes made first: freed at the end (outer), else before the
    bias's grad (the last "o" where there is a bias) and what follows it."""
    body = [["t", nbytes]] + shift_frees(toks, 1)
    at = len(body)
    if not outer and has_bias:
        outs = [j for j, (k, _) in enumerate(body) if k == "o"]
        at = outs[-1] if outs else at
    return body[:at] + [["f", 0]] + body[at:]


class Hidden:
    def __init__(self, gpu, rec):
        import torch

        self.rec = rec
        self.gpu = gpu
        self.vals = None  # the mode's known values (values.py), set by mode.py
        self._i64 = torch.int64
        self._aten = torch.ops.aten
        self._torch = torch
        self._channels_last = torch.channels_last
        self.row = load_table()["archs"][gpu.arch]
        self.conv = _conv_table(self.row.get("conv_workspace_table"))
        self.conv_ev = _conv_events(self.row.get("conv_events_table"))
        self._conv_nn = None  # convnn.Neighbours over conv_ev, made at the first need
        self.handles = set()
        self.lt_keys = set()
        a = torch.ops.aten
        mm_names = ["mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot",
                    "_addmm_activation", "_scaled_mm", "_int_mm"]
        self.matmul = set()
        for n in mm_names:
            op = getattr(a, n, None)
            if op is None:
                continue
            for o in op.overloads():
                self.matmul.add(getattr(op, o))
        self.lt_ops = {a.addmm.default, a.addmm.out, a._addmm_activation.default}
        self.addmm_activation = a._addmm_activation.default
        # layer_norm_cuda: X = input.expect_contiguous() before Y, mean, rstd;
        # layer_norm_backward_cuda: X before dX, dgamma, dbeta, then dY.contiguous() at the
        # kernel call (the order seen in real snapshots, e.g. ViT's batch_first attention
        # leaves the residual stream transposed)
        # amax/amin: the max/min values kernels max()/min() of everything run too
        self.reductions = {a.sum.dim_IntList, a.mean.dim, a.sum.default, a.mean.default,
                           a.prod.default, a.linalg_vector_norm.default}
        # the other reductions through gpu_reduce_kernel, by the family of their partial
        # results (reduce.partial_bytes); the rest accumulate in float ("acc")
        self.family = {a.all.default: "logical", a.any.default: "logical"}
        for op in (a.amax.default, a.amin.default, a.max.default, a.min.default):
            self.family[op] = "same"
        for op in (a.var.correction, a.std.correction, a.var_mean.correction,
                   a.std_mean.correction):
            self.family[op] = "welford"
        for op in (a.argmax.default, a.argmin.default, a.max.dim, a.min.dim):
            self.family[op] = "argpair"
        self.family[a.aminmax.default] = "minmax"
        for op in (a.all.dim, a.all.dims, a.any.dim, a.any.dims):
            self.family[op] = "logical"
        self.reductions |= set(self.family)
        # out= overloads (a composite's at::sum_out: logsumexp's) stage as their functional
        # twins
        self.out_twin = {}
        for out_op, twin in ((a.sum.IntList_out, a.sum.dim_IntList), (a.sum.out, a.sum.default),
                             (a.mean.out, a.mean.dim), (a.mean.dtype_out, a.mean.default),
                             (a.prod.out, a.prod.default), (a.amax.out, a.amax.default),
                             (a.amin.out, a.amin.default), (a.max.dim_max, a.max.dim),
                             (a.min.dim_min, a.min.dim), (a.max.unary_out, a.max.default),
                             (a.min.unary_out, a.min.default),
                             (a.linalg_vector_norm.out, a.linalg_vector_norm.default),
                             (a.var.correction_out, a.var.correction),
                             (a.std.correction_out, a.std.correction),
                             (a.var_mean.correction_out, a.var_mean.correction),
                             (a.std_mean.correction_out, a.std_mean.correction),
                             (a.argmax.out, a.argmax.default), (a.argmin.out, a.argmin.default),
                             (a.aminmax.out, a.aminmax.default), (a.all.all_out, a.all.default),
                             (a.any.all_out, a.any.default), (a.all.dims_out, a.all.dims),
                             (a.any.dims_out, a.any.dims)):
            self.out_twin[out_op] = twin
        self.reductions |= set(self.out_twin)
        # argmax/argmin without a dim reduce input.reshape(-1), aminmax without one and
        # max()/min() input.contiguous(): a copy, after the outputs, freed when the op
        # returns, where the input does not flatten as a view or is not contiguous
        # (argmax_argmin_impl, aminmax_out, ReduceAllOps' max/min; device run 30: a
        # transposed [4096, 2048] input's max() copies it, its amax() does not)
        self.flat_reductions = {a.argmax.default, a.argmin.default, a.aminmax.default,
                                a.max.default, a.min.default}
        self.contiguous_reductions = {a.aminmax.default, a.max.default, a.min.default}
        # reductions through ReduceOps' make_reduction: an input of another dtype than the
        # result is converted first (self.to(result dtype)), after the result, freed when
        # the kernel returns; half/bf16 into float is read as is (real snapshots: a bool
        # mask's sum() in transformers' fast_all allocates 8 bytes, then 8 a mask element)
        self.cast_reductions = {a.sum.default, a.sum.dim_IntList, a.nansum.default,
                                a.prod.default, a.prod.dim_int, a.mean.default, a.mean.dim}
        # outputs a CUDA kernel allocates in another order than it returns them:
        # native_dropout's mask before its output (real snapshots: BERT, nn.Transformer);
        # _embedding_bag's CUDA kernel: bag_size, offset2bag, then output (ho_recsys_embbag_amp)
        self.output_order = {a.native_dropout.default: (1, 0),
                             a._embedding_bag.default: (2, 1, 0, 3),
                             a._embedding_bag_forward_only.default: (2, 1, 0, 3),
                             # RNN.cu's fused cells make their workspace first
                             a._thnn_fused_lstm_cell.default: (2, 0, 1),
                             a._thnn_fused_gru_cell.default: (1, 0)}
        # softmax/log_softmax: the structured output first, then input.contiguous() (a
        # cross-entropy over sim.T in hf_bert_custom_loss's real snapshot)
        self.contig = {a.native_layer_norm.default: ([0], []),
                       a.native_layer_norm_backward.default: ([1], [0]),
                       a._log_softmax.default: ([], [0]), a._softmax.default: ([], [0])}
        # cuDNN's grid sampler takes grid.contiguous() before its outputs
        for op in ("cudnn_grid_sampler", "cudnn_grid_sampler_backward"):
            if hasattr(a, op):
                self.contig[getattr(a, op).default] = ([1], [])
        # the upsampling backwards take grad_output.contiguous() after grad_input (a grad
        # sliced by cat's backward: ho_unet_decoder_sgd's interpolate)
        for op in ("upsample_bilinear2d_backward", "upsample_nearest2d_backward",
                   "upsample_bicubic2d_backward"):
            self.contig[getattr(a, op).default] = ([], [0])
        # embedding's CUDA forward takes indices.reshape(-1): a copy, before the output and
        # freed after it, when a multi-dim index tensor cannot be flattened as a view (a
        # sliced batch of token ids: lm_large_vocab_ce's inputs[:, :-1])
        self.flat_copy = {a.embedding.default: 1}
        # structured losses reduced to a scalar (loss_tokens)
        self.struct_losses = {a.mse_loss.default, a.smooth_l1_loss.default}
        self.adv_index = {a.index.Tensor, a.index_put_.default, a.index_put.default,
                          a._index_put_impl_.default}
        self.emb_bwd = {a.embedding_dense_backward.default, a._embedding_bag_backward.default,
                        a._embedding_bag_dense_backward.default}
        # cumprod runs cumsum's code with another operator (impl_func_cum_ops, scan_dim: the
        # same conversion and cub scan), so it takes cumsum's measured rule
        self.sorting = {a.sort.default: "sort", a.sort.stable: "sort", a.topk.default: "topk",
                        a.cumsum.default: "cumsum", a.cumprod.default: "cumsum",
                        a.isin.Tensor_Tensor: "isin",
                        a.isin.Scalar_Tensor: "isin", a.multinomial.default: "multinomial"}
        # ops whose CUDA kernels take memory no rule here models yet: a warning, not a refusal
        # (their scratch is transient and small beside the tensors around them); index_put's
        # only when it accumulates (then it sorts) with index tensors other than int64 and
        # int32 ones (those are modelled: sorting.index_put_acc_tokens)
        idx_put = ("index_put_ with accumulate=True over a mask or other index tensors: its "
                   "sort buffers, five of 8 bytes an index and cub's scratch, transient")
        self.unmodelled = {a.index_put_.default: idx_put, a.index_put.default: idx_put,
                           a._index_put_impl_.default: idx_put}
        # linear algebra: cuSOLVER's and MAGMA's workspaces and info arrays; median, kthvalue
        # and mode: their sort's scratch
        solver = ("a linear-algebra kernel's cuSOLVER/MAGMA workspace and info arrays, "
                  "transient")
        for name in ("_linalg_svd", "linalg_qr", "_linalg_eigh", "linalg_eig", "linalg_inv_ex",
                     "_linalg_solve_ex", "linalg_cholesky_ex", "linalg_lu_factor_ex",
                     "linalg_lu", "_linalg_det", "_linalg_slogdet", "linalg_lstsq",
                     "linalg_householder_product", "triangular_solve", "cholesky_solve",
                     "cholesky_inverse", "geqrf", "ormqr", "linalg_ldl_factor_ex"):
            for op in _overloads(a, name):
                self.unmodelled[op] = solver
        sort_scratch = "a selection's sort scratch (median, kthvalue, mode), transient"
        for name in ("median", "nanmedian", "kthvalue", "mode"):
            for op in _overloads(a, name):
                self.unmodelled[op] = sort_scratch
        self.conv_fwd = {a.convolution.default}
        self.conv_bwd = {a.convolution_backward.default}
        # ops whose hidden allocations one method of their own gives, as around_outputs'
        # tokens (func, args, kwargs, n_outputs) -> tokens or None
        self.fft_ops = {a._fft_r2c.default: "r2c", a._fft_c2r.default: "c2r",
                        a._fft_c2c.default: "c2c"}
        self.op_rules = {a.native_group_norm.default: self.group_norm_tokens,
                         a.native_group_norm_backward.default: self.group_norm_backward_tokens,
                         a.binary_cross_entropy_with_logits.default: self.bce_logits_tokens,
                         a._foreach_norm.Scalar: self.foreach_norm_tokens,
                         a._safe_softmax.default: self.safe_softmax_tokens,
                         a._softmax_backward_data.default: self.softmax_backward_tokens,
                         a.roll.default: self.roll_tokens,
                         a.native_batch_norm.default: self.batch_norm_tokens,
                         a.native_batch_norm_backward.default: self.batch_norm_backward_tokens,
                         a.randperm.default: self.randperm_tokens,
                         a.max_pool2d_with_indices.default: self.max_pool_tokens,
                         a.max_pool2d_with_indices_backward.default: self.max_pool_tokens}
        self.op_rules.update((op, self.fft_tokens) for op in self.fft_ops)
        self.complex_to_float = {a.abs.default, a.angle.default}
        for op in (a.bmm.default, a.baddbmm.default):
            self.op_rules[op] = self.bmm_tokens
        gmm = getattr(a, "_grouped_mm", None)
        self.grouped_mm = gmm.default if gmm is not None else None
        if self.grouped_mm is not None:
            self.op_rules[self.grouped_mm] = self.grouped_mm_tokens
            self.matmul.add(self.grouped_mm)  # its fallback loops cuBLAS mm_out
        for op in (a._to_copy.default, a.copy_.default):
            self.op_rules[op] = self.host_copy_tokens
        for op in self.struct_losses:
            self.op_rules[op] = self.loss_tokens
        for op in self.adv_index:
            self.op_rules[op] = self.adv_index_tokens
        self.stats = {"cublas_handles": 0, "cublaslt": 0, "conv_workspaces": 0,
                      "conv_unmeasured": 0, "conv_measured": 0}

    def modelled(self):
        """Every op a rule here models as one call (mode.py runs no composite of theirs)."""
        return (set(self.op_rules) | set(self.contig) | set(self.flat_copy) | self.adv_index |
                self.struct_losses | self.emb_bwd | set(self.sorting) | set(self.unmodelled) |
                self.conv_fwd | self.conv_bwd | self.matmul | set(self.output_order) |
                self.cast_reductions | self.reductions)

    def around_outputs(self, func, args, kwargs, n_outputs):
        """The op's hidden allocations around its n cuda outputs as event tokens (see
        replay_tokens), or None: an op in op_rules gets its own method's; else the copies of
        non-contiguous inputs (before the outputs, after them, all freed in the order
        made), or a reduction's converted input (after
        the output, freed last); then Reduce.cuh's staging buffer and semaphores
        (semaphores freed first)."""
        if func in self.complex_to_float and args and hasattr(args[0], "is_complex") and \
                args[0].is_complex() and args[0].device.type == "cuda" and n_outputs == 1:
            # abs/angle of a complex tensor: TensorIterator computes in the complex type into
            # a temporary and casts it out to the float result (device run 46:
            # hh_stft_audio_cnn's spec.abs(), a complex-sized block after the output, freed)
            x = args[0]
            return [["o", 0], ["t", x.numel() * x.element_size()], ["f", 0]]
        rule = self.op_rules.get(func)
        if rule is not None:
            return rule(func, args, kwargs, n_outputs)
        copies = self.contiguous_copies(func, args)
        cast = self.reduce_cast(func, args, kwargs) or self.reduce_flat_copy(func, args, kwargs)
        staged = self.reduce_staging(func, args, kwargs)
        if not copies and not staged and not cast:
            return None
        pre, post = copies or ([], [])
        toks = [["t", n] for n in pre] + [["o", 0]] * n_outputs + [["t", n] for n in post]
        toks += [["f", i] for i in range(len(pre) + len(post))]
        k = len(pre) + len(post)
        if cast:
            toks.append(["t", cast])
        if staged:
            j = k + (1 if cast else 0)
            toks += [["t", staged[0]], ["t", staged[1]], ["f", j + 1], ["f", j]]
        if cast:
            toks.append(["f", k])
        return toks

    def host_copy_tokens(self, func, args, kwargs, n_outputs):
        """_to_copy and copy_ between the host and the GPU, as copy_kernel_cuda runs them: a
        copy that is not one contiguous run of the same dtype on both sides
        (copy_requires_temporaries) goes through contiguous temporaries, converted on the
        host when blocking and on the GPU when not; the GPU's side of them is allocated
        after the output and freed before the op returns (device run 29: ResNet-50's
        `.to(device, memory_format=torch.channels_last)` copies each 4-d weight to a
        contiguous GPU block first, then into the channels_last parameter)."""
        from torch._prims_common import make_channels_last_strides_for, make_contiguous_strides_for

        torch = self._torch
        b = _bind(func, args, kwargs)
        if func is self._aten.copy_.default:
            dst, src = b.get("self"), b.get("src")
            if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
                return None
            dst_dtype, dst_dev, non_blocking = dst.dtype, dst.device, bool(b.get("non_blocking"))
            dst_contig = dst.is_contiguous()
            same_layout = tuple(src.shape) == tuple(dst.shape) and src.stride() == dst.stride()
        else:
            src = b.get("self")
            if not isinstance(src, torch.Tensor):
                return None
            dst_dtype = b.get("dtype") or src.dtype
            dst_dev = torch.device(b["device"]) if b.get("device") is not None else src.device
            non_blocking = bool(b.get("non_blocking"))
            fmt = b.get("memory_format")
            if fmt is None or fmt == torch.preserve_format:
                # the output keeps src's strides (dense src) or src's dim order
                dst_contig, same_layout = src.is_contiguous(), True
            else:
                # the output in that format; contiguous too where only size-1 dims differ
                # (a depthwise [C, 1, k, k] weight in channels_last)
                contig = make_contiguous_strides_for(src.shape)
                in_fmt = make_channels_last_strides_for(src.shape) if src.dim() == 4 else contig
                dst_contig = fmt == torch.contiguous_format or \
                    not strides_differ(src.shape, in_fmt, contig)
                same_layout = src.is_contiguous(memory_format=fmt)
        if (src.device.type == "cuda") == (dst_dev.type == "cuda"):
            return None  # same side: no temporaries (or no GPU at all)
        n = src.numel() if func is not self._aten.copy_.default else dst.numel()
        same = src.dtype == dst_dtype
        from torch._prims_common import is_non_overlapping_and_dense_or_false as dense_of

        dense = same_layout and dense_of(src)
        if n <= 1 or (same and dense):
            return None  # one contiguous run: cudaMemcpyAsync
        temps = []  # the GPU's temporaries, in order; the first freed last
        if dst_dev.type == "cuda":
            if not non_blocking and not dst_contig:
                temps.append(n * dst_dtype.itemsize)  # dst_contig, converted on the host
            elif non_blocking and not (dst_contig and same):
                temps.append(n * src.element_size())  # dst_contig in src's dtype
        else:
            src_contig = same_layout and src.is_contiguous()
            if non_blocking and not same:
                # src.to(dtype) on the GPU (src's layout), then contiguous() unless it is
                temps.append(n * dst_dtype.itemsize)
                if not src_contig:
                    temps.append(n * dst_dtype.itemsize)
                    toks = [["t", temps[0]], ["t", temps[1]], ["f", 0], ["f", 1]]
                    return [["o", 0]] * n_outputs + toks
            elif not src_contig:
                temps.append(n * src.element_size())
        if not temps:
            return None
        toks = [["t", t] for t in temps] + [["f", i] for i in reversed(range(len(temps)))]
        return [["o", 0]] * n_outputs + toks

    def randperm_tokens(self, func, args, kwargs, n_outputs):
        """randperm(n) on CUDA: sorting.randperm_tokens (a warning past cub's single tile,
        whose scratch was not measured)."""
        import torch

        from .sorting import randperm_tokens

        if n_outputs != 1:
            return None
        dtype = kwargs.get("dtype") or torch.int64
        toks, measured = randperm_tokens(int(args[0]), dtype.itemsize)
        if not measured:
            self.rec.warn("not modelled: randperm's sort scratch past cub's single tile "
                          "(not measured), taken as a full radix sort's")
        return toks

    def group_norm_tokens(self, func, args, kwargs, n_outputs):
        """native_group_norm, affine over HxW > 1: per-(sample, channel) scale and shift, N x C
        in the accumulation type, after the outputs, freed later-first (ho_unet_decoder_sgd's
        real snapshot: 2 x 8 x 64 x 4 bytes after each GroupNorm(8, 64))."""
        x, w, bias = args[0], args[1], args[2]
        n, c, hxw = int(args[3]), int(args[4]), int(args[5])
        if x.device.type != "cuda" or hxw == 1 or (w is None and bias is None) or not n * c:
            return None
        acc = self._acc(x.dtype)
        return [["o", 0]] * n_outputs + [["t", n * c * acc], ["t", n * c * acc],
                                          ["f", 1], ["f", 0]]

    def group_norm_backward_tokens(self, func, args, kwargs, n_outputs):
        """native_group_norm_backward(grad, X, mean, rstd, gamma, N, C, HxW, group, mask): ds
        and db (N x C), and for dX c2, c3 (N x G) and, with gamma, c1 (N x C) sized by its
        iterator; c3, c2, c1 then db, ds freed (ho_unet_decoder_sgd's real backward)."""
        x, gamma = args[1], args[4]
        n, c, hxw, g = int(args[5]), int(args[6]), int(args[7]), int(args[8])
        mask = list(args[9]) if len(args) > 9 else [True, True, True]
        if x.device.type != "cuda" or hxw == 1 or not n * c:
            return None
        acc = self._acc(x.dtype)
        toks = [["o", 0]] * n_outputs + [["t", n * c * acc], ["t", n * c * acc]]
        if mask[0]:
            toks += [["t", n * g * acc], ["t", n * g * acc]]
            if gamma is not None:
                toks += [["t", n * c * acc], ["f", 3], ["f", 2], ["f", 4]]
            else:
                toks += [["f", 3], ["f", 2]]
        return toks + [["f", 1], ["f", 0]]

    def _bn_channels_last(self, x, w):
        """(C, rows) when PyTorch's native channels-last batch-norm kernels run on x, else
        None. They run for a tensor dense in channels-last order (or contiguous with
        stride(1) == 1: BatchNorm1d's [N, C]), where cuDNN's batch norm does not: a bf16
        input or weight, or fewer than 3 dims. Other dtypes may go to cuDNN (left as the
        fake kernel has them)."""
        t = self._torch
        if x.device.type != "cuda" or x.dim() < 2 or not x.numel():
            return None
        cl = (x.dim() == 4 and x.is_contiguous(memory_format=t.channels_last)) or \
            (x.dim() == 5 and x.is_contiguous(memory_format=t.channels_last_3d)) or \
            (x.is_contiguous() and x.stride(1) == 1)
        native = x.dim() < 3 or x.dtype == t.bfloat16 or (w is not None and w.dtype == t.bfloat16)
        if not (cl and native):
            return None
        c = int(x.shape[1])
        return c, x.numel() // c

    @staticmethod
    def _bn_grid(c, rows):
        """flexible_launch_configs (Normalization.cuh) with its cooperative flag, as the
        channels-last stats and backward-reduce kernels call it: (grid.x, grid.y)."""
        last_pow2 = lambda n: 1 << (max(int(n), 1).bit_length() - 1)
        bx = min(last_pow2(c), 32)
        by = min(last_pow2(-(-rows // 16)), 512 // bx)
        if bx * by != 512:
            bx = min(last_pow2(c), 512 // by)
        gx = -(-c // bx)
        gy = min(-(-rows // (by * 16)), 128)
        return gx, (1 if gy < 8 else gy)

    def batch_norm_tokens(self, func, args, kwargs, n_outputs):
        """native_batch_norm(x, w, b, running_mean, running_var, training, ...) in training on
        the channels-last kernels: after the output, mean and invstd, the grid reduction's
        staging (4 x C x grid.y floats) and semaphores (grid.x ints), semaphores freed
        first; none when grid.y < 8 (hx_resnet50_channels_last_bf16's real forward: 131,072
        + 8 bytes after a [32, 64, 112, 112] BN, none after [32, 2048, 7, 7])."""
        x, w = args[0], args[1]
        if len(args) < 6 or not args[5]:
            return None
        cl = self._bn_channels_last(x, w)
        if cl is None:
            return None
        c, rows = cl
        gx, gy = self._bn_grid(c, rows)
        if gy == 1:
            return None
        acc = self._acc(x.dtype)
        return [["o", 0]] * n_outputs + [["t", 4 * c * gy * acc], ["t", 4 * gx],
                                          ["f", 1], ["f", 0]]

    def batch_norm_backward_tokens(self, func, args, kwargs, n_outputs):
        """native_batch_norm_backward(grad, x, w, running_mean, running_var, save_mean,
        save_invstd, train, eps, mask) on the channels-last kernels: sum_dy and sum_dy_xmu
        (C floats each), grad_weight and grad_bias, the staging (2 x C x grid.y floats,
        grid.y >= 8) and semaphores, then grad_input, then sum_dy_xmu and sum_dy freed
        (hx_resnet50_channels_last_bf16's real backward). The outputs come in the op's
        order (grad_input, grad_weight, grad_bias)."""
        g, x, w = args[0], args[1], args[2]
        mask = list(args[9]) if len(args) > 9 else [True, True, True]
        if not (mask[0] or mask[1] or mask[2]) or not (len(args) > 7 and args[7]):
            return None
        cl = self._bn_channels_last(x, w)
        if cl is None or self._bn_channels_last(g, w) is None:
            return None
        c, rows = cl
        acc = self._acc(x.dtype)
        if sum(1 for m in mask[:3] if m) != n_outputs:
            return None
        gx, gy = self._bn_grid(c, rows)
        toks = [["t", c * acc], ["t", c * acc]]
        # outputs by their index among the op's cuda outputs: grad_input is the last made
        k = 1 if mask[0] else 0
        toks += [["oi", k + j] for j in range(int(bool(mask[1])) + int(bool(mask[2])))]
        if gy > 1:
            toks += [["t", 2 * c * gy * acc], ["t", 4 * gx], ["f", 3], ["f", 2]]
        if mask[0]:
            toks.append(["oi", 0])
        return toks + [["f", 1], ["f", 0]]

    def adv_index_tokens(self, func, args, kwargs, n_outputs):
        """index / index_put_: an accumulating one's sort (sorting.index_put_acc_tokens), or
        the index conversions and copies (index_copies) before the outputs, freed after them:
        the conversions first, then the copies later-first."""
        acc = self.index_put_acc(func, args, kwargs)
        if acc is not None:
            from .sorting import index_put_acc_tokens

            kw = dict(acc[4])
            mask = kw.pop("mask")
            if mask is None:
                return index_put_acc_tokens(acc[0], acc[1], n_outputs, acc[2], acc[3], **kw)
            # a known bool mask: its nonzero first, its columns the index tensors, freed
            # once the linear index is made (device run 47's x[mask] backward)
            from .datadep import nonzero_kept

            pre, made, nz = nonzero_kept(*mask)
            if acc[0] == 0:
                return pre + [["o", 0]] * n_outputs + [["f", nz]]
            return pre + index_put_acc_tokens(acc[0], acc[1], n_outputs, acc[2], acc[3],
                                              prefix=made, free_after_linear=(nz,), **kw)
        cs = self.index_copies(func, args, kwargs)
        if not cs:
            return None
        conv, copies = cs
        # the int64 conversions go first, then the copies later-first (device run 31)
        return ([["t", c] for c in conv + copies] + [["o", 0]] * n_outputs +
                [["f", i] for i in range(len(conv))] +
                [["f", len(conv) + i] for i in reversed(range(len(copies)))])

    def foreach_norm_tokens(self, func, args, kwargs, n_outputs):
        buf = self.foreach_norm_partials(args, kwargs)
        return [["t", buf], *([["o", 0]] * n_outputs), ["f", 0]] if buf else None

    def safe_softmax_tokens(self, func, args, kwargs, n_outputs):
        """_safe_softmax (SDPA's math path), as PyTorch 2.11 runs it: softmax into the
        output, `isneginf(self)`, its `all` over the dim (keepdim), a 0-dim zero of the
        output's dtype, then `where_out` into the output; the three freed later-first
        (hx_t5_train_bf16's real snapshot: 8388608, 16384 and 4 bytes after each 32 MiB
        [8, 4, 512, 512] fp32 softmax)."""
        x = args[0]
        if n_outputs != 1 or x.device.type != "cuda" or x.numel() == 0:
            return None
        dim = int(args[1]) % max(x.dim(), 1)
        dt = _bind(func, args, kwargs).get("dtype") or x.dtype
        rows = x.numel() // max(x.shape[dim], 1) if x.dim() else 1
        return [["o", 0], ["t", x.numel()], ["t", rows], ["t", dt.itemsize],
                ["f", 2], ["f", 1], ["f", 0]]

    def softmax_backward_tokens(self, func, args, kwargs, n_outputs):
        """softmax's CUDA backward computes `tmp = grad * output` after grad_input and frees
        it when the kernel returns (log_softmax's does not): hx_t5_train_bf16's real
        backward, a [B, H, T, T] fp32 transient after each grad_input."""
        g, y = args[0], args[1]
        if n_outputs != 1 or g.device.type != "cuda" or g.numel() == 0:
            return None
        n = math.prod(self._torch.broadcast_shapes(tuple(g.shape), tuple(y.shape)))
        return [["o", 0], ["t", n * self._torch.result_type(g, y).itemsize], ["f", 0]]

    def max_pool_tokens(self, func, args, kwargs, n_outputs):
        """max_pool2d on CUDA (DilatedMaxPool2d.cu) takes its tensors contiguous in the
        input's suggested memory format after its outputs: the forward the input; the
        backward the input, grad_output, then the indices; freed as it returns, last made
        first (device run 41's hp_crnn_ctc: the gradient coming back through a permute into
        a (4, 1) pool is copied, 2 MiB)."""
        torch = self._torch
        b = _bind(func, args, kwargs)
        x = b.get("self")
        if x is None or x.device.type != "cuda" or x.dim() not in (3, 4):
            return None
        backward = func is self._aten.max_pool2d_with_indices_backward.default
        if backward and b.get("grad_output") is not None and b["grad_output"].numel() == 0:
            return None
        from torch._prims_common import suggest_memory_format

        fmt = suggest_memory_format(x) if x.dim() == 4 else torch.contiguous_format
        ts = [x, b.get("grad_output"), b.get("indices")] if backward else [x]
        sizes = [t.numel() * t.element_size() for t in ts
                 if t is not None and t.numel() and not t.is_contiguous(memory_format=fmt)]
        if not sizes:
            return None
        return [["o", 0]] * n_outputs + [["t", n] for n in sizes] + \
            [["f", i] for i in reversed(range(len(sizes)))]

    def fft_tokens(self, func, args, kwargs, n_outputs):
        """cuFFT's path (fft.py): input copies, clones and the plans' work areas around the
        output; a plan whose work area this architecture's table lacks is refused."""
        from . import fft
        from .capture import UnsupportedOp

        x = args[0]
        if n_outputs != 1 or x.device.type != "cuda" or x.numel() == 0:
            return None
        name = self.row.get("fft_table")
        pts_of = fft.table(name) if name else {}

        def lookup(kind, value, signal, batch, layout):
            dt = str(value).replace("torch.", "")
            pts = pts_of.get((kind, dt, tuple(signal), layout))
            if pts is None:
                raise UnsupportedOp(func, (
                    "cuFFT's work area for its %s plan over %s-point %s signals%s at batch %d "
                    "was not measured for this GPU's architecture (scripts/trace_corpus/fft/"
                    "measure_fft.py measures it on a GPU)") % (
                        kind.upper(), "x".join(map(str, signal)), dt,
                        "" if layout == "simple" else " (%s layout)" % layout, batch))
            ws = fft.work_area(pts, batch)
            if ws and pts[0][0] < batch < pts[-1][0] and all(b != batch for b, _ in pts):
                self.rec.warn(FFT_INTERPOLATED)
            return ws
        b = _bind(func, args, kwargs)
        third = {"r2c": "onesided", "c2r": "last_dim_size", "c2c": "forward"}
        kind = self.fft_ops[func]
        return fft.tokens(kind, x, (list(b["dim"]), b["normalization"], b[third[kind]]),
                          lookup)

    def roll_tokens(self, func, args, kwargs, n_outputs):
        """torch.roll as roll_cuda runs it: a non-contiguous input copied first (freed once
        the first roll is made), and over several dims one roll per dim, each into a new
        tensor, the intermediates freed last to first (Swin's cyclic shift over H and W: two
        blocks where the fake kernel makes one, in ho_tv_swin_infer's real snapshot)."""
        b = _bind(func, args, kwargs)
        x, dims = b.get("self"), list(b.get("dims") or [])
        if n_outputs != 1 or x.device.type != "cuda" or x.numel() == 0:
            return None
        n = x.numel() * x.element_size()
        copy = not x.is_contiguous()
        levels = max(len(dims), 1)
        if levels == 1 and not copy:
            return None
        toks, temps = [], []
        if copy:
            toks.append(["t", n])
        for lvl in range(levels):
            if lvl == levels - 1:
                toks.append(["o", 0])
            else:
                temps.append(len(temps) + int(copy))
                toks.append(["t", n])
            if lvl == 0 and copy:
                toks.append(["f", 0])
        return toks + [["f", i] for i in reversed(temps)]

    def _acc(self, dtype):
        """Bytes of the accumulation type CUDA kernels use for dtype (fp32, fp64 for doubles)."""
        return 8 if dtype in (self._torch.float64, self._torch.complex128) else 4

    def _loss_size(self, x, y):
        """Elements and element bytes of a loss over x and y broadcast."""
        return (math.prod(self._torch.broadcast_shapes(tuple(x.shape), tuple(y.shape))),
                self._torch.result_type(x, y).itemsize)

    def _full_staging_tokens(self, n, elem, first):
        """A full reduction of n values' staging and semaphores, allocated and freed, as
        tokens whose transients are numbered from `first`; [] when it does not split."""
        from .reduce import full_reduce_staging

        st = full_reduce_staging(n, self.gpu.multi_processor_count, 8 if elem == 8 else 4,
                                 self.gpu.max_threads_per_sm)
        if not st:
            return []
        return [["t", st[0]], ["t", st[1]], ["f", first + 1], ["f", first]]

    def loss_tokens(self, func, args, kwargs, n_outputs):
        """mse_loss and smooth_l1_loss reduced to a scalar, as their structured kernels run:
        the meta function sizes the result for the whole broadcast input, then resizes it to
        0-dim (the scalar keeps that block); the kernel writes the elementwise loss into a
        temporary of the same size and mean_out/sum_out it into the result (a full
        reduction's staging when it splits). adam_capturable's smooth_l1 (2M elements: 8 MiB
        kept, 8 MiB and 1024 + 4 bytes transient) and ckpt_transformer_blocks' mse (8192)
        in their real H100 snapshots."""
        b = _bind(func, args, kwargs)
        x, y = b.get("self"), b.get("target")
        if n_outputs != 1 or not hasattr(x, "device") or x.device.type != "cuda" or \
                int(b.get("reduction", 1)) == 0 or float(b.get("beta", 1.0)) == 0.0:
            return None
        n, elem = self._loss_size(x, y)
        if n == 0:
            return None
        return ([["s", n * elem], ["t", n * elem]] + self._full_staging_tokens(n, elem, 1) +
                [["f", 0]])

    def bce_logits_tokens(self, func, args, kwargs, n_outputs):
        """binary_cross_entropy_with_logits (no pos_weight), as its CUDA composite runs:
        log_sigmoid(input), then (1 - target) multiplied and subtracted in place, reduced;
        the two input-sized tensors freed after the result, later-first
        (ho_recsys_embbag_amp's real snapshot: 8192, 8192, the 4-byte mean)."""
        b = _bind(func, args, kwargs)
        x, y = b.get("self"), b.get("target")
        if n_outputs != 1 or not hasattr(x, "device") or x.device.type != "cuda" or \
                b.get("pos_weight") is not None:
            return None
        log_sigmoid = x.numel() * x.element_size()
        if int(b.get("reduction", 1)) == 0:
            return [["t", log_sigmoid], ["o", 0], ["f", 0]]
        n, elem = self._loss_size(x, y)
        return ([["t", log_sigmoid], ["t", n * elem], ["o", 0]] +
                self._full_staging_tokens(n, elem, 2) + [["f", 1], ["f", 0]])

    def index_put_acc(self, func, args, kwargs):
        """sorting.index_put_acc_tokens' arguments (n, size, checked, values_copy, and by
        name the rest) for an accumulating index_put_ on a cuda tensor with int64 or int32
        index tensors, or one bool mask whose values the trace knows (its nonzero's columns
        are the index tensors; by name also "mask": the mask's elements, its nonzero's bytes,
        its contiguous copy), or None."""
        if func is self._aten.index.Tensor:
            return None
        b = _bind(func, args, kwargs)
        x, idx = b.get("self"), b.get("indices") or []
        if not b.get("accumulate") or not hasattr(x, "device") or x.device.type != "cuda":
            return None
        ts = [(d, t) for d, t in enumerate(idx) if t is not None]
        i32 = self._torch.int32
        mask = None
        if len(ts) == 1 and ts[0][1].dtype in (self._torch.bool, self._torch.uint8) and \
                self.vals is not None:
            from .datadep import known_mask

            d0, t = ts[0]
            known = known_mask(self.vals, t)
            if known is None:
                return None
            count, mask = known
            ts = [(d0 + j, self._torch.empty(count, dtype=self._i64, device="meta"))
                  for j in range(t.dim())]
        if not ts or any(t.dtype not in (self._i64, i32) for _, t in ts):
            return None
        dims = [d for d, _ in ts]
        n = math.prod(self._torch.broadcast_shapes(*[tuple(t.shape) for _, t in ts]))
        adjacent = dims == list(range(dims[0], dims[-1] + 1))
        # the slice: the dims after the indexed block (after moving them to the front when
        # they are not adjacent); the linear index / slice ranges over the rest
        after = x.shape[dims[-1] + 1:] if adjacent else \
            [s for d, s in enumerate(x.shape) if d not in dims]
        slice_ = math.prod(after)
        size = (x.numel() - 1) // slice_ + 1 if slice_ and x.numel() else 1
        v = b.get("values")
        copy = 0
        if hasattr(v, "is_contiguous") and x.dim():
            full = n * x.numel() // max(1, math.prod(x.shape[d] for d in dims))
            if not v.is_contiguous() or v.numel() != full:
                copy = full * v.element_size()
        return (n, size, not b.get("unsafe", False), copy,
                dict(n_index=len(ts),
                     long_copies=[t.numel() * 8 for _, t in ts if t.dtype == i32],
                     permuted_copy=0 if adjacent else x.numel() * x.element_size(),
                     mask=mask))

    def index_copies(self, func, args, kwargs):
        """([bytes of each int32 index converted to int64], [bytes of each index copied]) of
        advanced indexing on CUDA, or None. Copies: with two or more
        index tensors whose broadcast strides differ, each is made contiguous at the
        broadcast shape (AdvancedIndex), before the output and freed after it, later-first
        (transformers' padding mask_function, padding_mask[batch_idx, kv_idx], in BERT's
        real snapshot: two int64 copies of B x S)."""
        b = _bind(func, args, kwargs)
        if func is not self._aten.index.Tensor and b.get("accumulate"):
            return None  # the sort path (warned)
        x, idx = b.get("self"), b.get("indices") or []
        ts = [t for t in idx if t is not None]
        if not ts or not hasattr(x, "device") or x.device.type != "cuda" or \
                any(t.dtype in (self._torch.bool, self._torch.uint8) for t in ts):
            return None
        shape = list(self._torch.broadcast_shapes(*[tuple(t.shape) for t in ts]))
        n = math.prod(shape)
        if not n:
            return None
        from torch._prims_common import make_contiguous_strides_for

        dense = list(make_contiguous_strides_for(shape))

        def expanded(t):
            pad = len(shape) - t.dim()
            st = [0] * pad
            for d, (m, s_) in enumerate(zip(t.shape, t.stride())):
                st.append(0 if m == 1 and shape[pad + d] != 1 else s_)
            return st

        # make_info converts int32 index tensors to int64 at the broadcast shape first
        # (dense: hy_gpt2_seq_logprob_index3's int32 labels beside two int64 aranges, real
        # H100 run: three 8-byte copies of B x T)
        conv = [t.dtype == self._torch.int32 for t in ts]
        strides = [dense if c else expanded(t) for t, c in zip(ts, conv)]
        copies = []
        if len(ts) >= 2 and not all(st == strides[0] for st in strides):
            # AdvancedIndex: each index not contiguous at the broadcast shape is copied
            copies = [n * ts[i].element_size() for i, st in enumerate(strides) if st != dense]
        conv = [n * 8 for c in conv if c]
        return (conv, copies) if conv or copies else None

    def foreach_norm_partials(self, args, kwargs):
        """Bytes of _foreach_norm's per-chunk partial norms: the fast path (one device and
        dtype, ord 2 or 1) zeroes fp32 sums for every tensor x the most 65536-element chunks
        any tensor has, before the outputs, freed after them (clip_grad_norm_ in GPT-2's and
        BERT's real snapshots: 52 tensors x 589 chunks = 122512 bytes)."""
        b = _bind(self._aten._foreach_norm.Scalar, args, kwargs)
        ts = b.get("self") or []
        if not ts or float(b.get("ord", 2)) not in (1.0, 2.0) or b.get("dtype") is not None:
            return 0
        t0 = ts[0]
        if not hasattr(t0, "device") or t0.device.type != "cuda" or any(
                t.device != t0.device or t.dtype != t0.dtype for t in ts):
            return 0
        acc = self._acc(t0.dtype)
        chunks = max(-(-t.numel() // 65536) for t in ts)
        return len(ts) * chunks * acc

    def reduce_cast(self, func, args, kwargs):
        """Bytes of the converted input a sum/prod/mean makes first, or 0."""
        if func not in self.cast_reductions or not args:
            return 0
        torch = self._torch
        x = args[0]
        if not hasattr(x, "device") or x.device.type != "cuda" or x.numel() == 0:
            return 0
        out = _bind(func, args, kwargs).get("dtype")
        if out is None:
            integral = not (x.dtype.is_floating_point or x.dtype.is_complex)
            out = torch.int64 if integral and func.overloadpacket.__name__ != "mean" else x.dtype
        if out == x.dtype or (x.dtype in (torch.float16, torch.bfloat16) and out == torch.float32):
            return 0
        return x.numel() * out.itemsize

    def reduce_flat_copy(self, func, args, kwargs):
        """Bytes of the flat or contiguous copy argmax/argmin/aminmax without a dim and
        max()/min() reduce, or 0."""
        base = self.out_twin.get(func, func)
        if base not in self.flat_reductions or not args:
            return 0
        x = args[0]
        if not hasattr(x, "device") or x.device.type != "cuda" or x.numel() == 0 or \
                _bind(func, args, kwargs).get("dim") is not None:
            return 0
        flat = x.is_contiguous() if base in self.contiguous_reductions else _flattens_as_view(x)
        return 0 if flat else x.numel() * x.element_size()

    # -- reductions' global staging (reduce.py) -----------------------------------------
    def reduce_staging(self, func, args, kwargs=None):
        """(buffer, semaphores) bytes a reduction over dims takes while it runs, or None
        (Adafactor's `p.norm(2)` of T5's 32128 x 512 embedding: 2112 and 4 bytes in
        hf_t5_small_train_adafactor's real snapshot)."""
        if func not in self.reductions or not args:
            return None
        from .reduce import layout_staging, staging

        x = args[0]
        if not hasattr(x, "device") or x.device.type != "cuda":
            return None
        base = self.out_twin.get(func, func)
        family = self.family.get(base, "acc")
        # None or [] (amax's default, sum's dim=None): all of them
        dims = _bind(func, args, kwargs or {}).get("dim")
        if dims is None or (isinstance(dims, (list, tuple)) and not dims):
            if base in self.flat_reductions and x.numel():
                # the flat (or contiguous) input: one dense dim
                return layout_staging([x.numel()], [1], 0, x.dtype, [0], self.gpu, family)
            dims = []  # a full reduction
        if isinstance(dims, int):
            dims = [dims]
        return staging(x, list(dims), self.gpu, family)

    # -- inputs a CUDA kernel makes contiguous ------------------------------------------
    def contiguous_copies(self, func, args):
        """The copies a CUDA kernel makes of its non-contiguous inputs (`expect_contiguous()`
        inside the kernel, invisible to its meta twin): ([sizes before the outputs], [sizes
        after]), all freed when the op returns; None when there is none."""
        i = self.flat_copy.get(func)
        if i is not None:
            t = args[i] if i < len(args) else None
            if t is not None and hasattr(t, "dim") and t.device.type == "cuda" and t.dim() > 1 \
                    and t.numel() and not _flattens_as_view(t):
                return ([t.numel() * t.element_size()], [])
            return None
        spec = self.contig.get(func)
        if spec is None:
            return None
        out = ([], [])
        for side, idxs in enumerate(spec):
            for i in idxs:
                t = args[i] if i < len(args) else None
                if t is not None and hasattr(t, "is_contiguous") and t.device.type == "cuda" \
                        and not t.is_contiguous() and t.numel():
                    out[side].append(t.numel() * t.element_size())
        return out if out[0] or out[1] else None

    # -- cuBLAS ---------------------------------------------------------------------------
    def bmm_tokens(self, func, args, kwargs, n_outputs):
        """bmm/baddbmm's operand copies (baddbmm_out_cuda_impl's
        prepare_batch_matrix_for_cublas): a batch of matrices cuBLAS cannot read in place,
        neither row- nor column-major with a leading stride that fits, and not contiguous, is
        cloned contiguous; with the (contiguous) result read transposed the second operand
        is prepared first. Made after the output, freed when the op returns, the later first
        (device run 46: hh_fno2d_spectral_train's complex einsum weights, permuted (x, y, i, o)
        views of an (i, o, x, y) parameter)."""
        b1, b2 = (args[1], args[2]) if func is self._aten.baddbmm.default else \
            (args[0], args[1])
        if n_outputs != 1 or not hasattr(b1, "dim") or b1.dim() != 3 or b2.dim() != 3 or \
                b1.device.type != "cuda" or not b1.numel() or not b2.numel():
            return None

        def copy(t):
            _, r, c = t.shape
            s = t.stride()
            if (s[2] == 1 and s[1] >= max(1, c)) or (s[1] == 1 and s[2] >= max(1, r)) or \
                    (t.is_contiguous() and s[1] != 0 and s[2] != 0):
                return 0
            return t.numel() * t.element_size()
        sizes = [n for n in (copy(b2), copy(b1)) if n]
        if not sizes:
            return None
        return [["o", 0]] + [["t", n] for n in sizes] + \
            [["f", i] for i in reversed(range(len(sizes)))]

    def matmul_after(self, func, args, kwargs):
        rec = self.rec
        if any(getattr(a, "numel", None) is not None and not isinstance(a, (int, float)) and
               a.numel() == 0 for a in args):
            return  # an empty operand: PyTorch returns without calling cuBLAS
        if func is self.grouped_mm and self.grouped_mm_fast(args, kwargs):
            return  # CUTLASS's grouped GEMM
        key = (threading.get_ident(), rec.current_stream_ident())
        fr = None
        if key not in self.handles:
            self.handles.add(key)
            fr = rec._frames()
            rec.hidden_alloc(self.row["cublas_handle_workspace"], frames=fr)
            self.stats["cublas_handles"] += 1
        if key not in self.lt_keys and func in self.lt_ops:
            # cuBLASLt's workspace, like cuBLAS's, is per (thread, stream): autograd's device
            # thread takes its own when a checkpointed forward is recomputed there
            # (ckpt_transformer_blocks' real snapshot: a second 1 MiB in the first backward)
            if _addmm_takes_lt(func is self.addmm_activation, args, kwargs):
                self.lt_keys.add(key)
                rec.hidden_alloc(self.row["cublaslt_workspace"], frames=fr or rec._frames())
                self.stats["cublaslt"] += 1

    # -- grouped GEMM (MoE experts) -----------------------------------------------------
    def grouped_mm_fast(self, args, kwargs):
        """Whether a call of at::_grouped_mm(mat_a, mat_b, offs, bias, out_dtype) runs its
        CUTLASS kernel (bf16 in and out, on sm90/sm100) rather than its fallback (offs.cpu(),
        then one cuBLAS mm_out per group)."""
        a, b = args[0], args[1]
        out_dtype = kwargs.get("out_dtype", args[4] if len(args) > 4 else None)
        bf16 = self._torch.bfloat16
        return a.dtype == bf16 and b.dtype == bf16 and (out_dtype or bf16) == bf16 and \
            self.gpu.major in (9, 10)

    def grouped_mm_tokens(self, func, args, kwargs, n_outputs):
        """The CUTLASS kernel's argument buffer, then its workspace, after the output; the
        workspace freed first when it returns (bf16bf16_grouped_gemm_impl_sm90_sm100: per
        group three pointers, rounded to an even count, a 12-byte problem shape and three
        8-byte strides; Gemm::get_workspace_size: four 128-byte TMA descriptors per SM, which
        the grouped kernel rewrites on the device for each group: 67,584 bytes on an H100's
        132 SMs in hq_mixtral_moe_fp32_bf16's real run). The fallback allocates nothing
        beside its output."""
        if not self.grouped_mm_fast(args, kwargs):
            return None
        a, b = args[0], args[1]
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        g = offs.size(0) if a.dim() == 2 and b.dim() == 2 else \
            (b.size(0) if a.dim() == 2 else a.size(0))
        ws = 4 * 128 * self.gpu.multi_processor_count
        return [["o", 0]] * n_outputs + [["t", 24 * _ceil(g, 2) + 36 * g], ["t", ws], ["f", 1],
                                         ["f", 0]]

    # -- cuDNN convolution --------------------------------------------------------------
    def conv_workspace(self, pas, x_shape, w_shape, out_shape, stride, padding, dilation,
                       groups, dtype, itemsize, transposed=False):
        """The workspace of a conv the events table does not hold: the meta twin's fp32
        table's points; else the nearest measured shape's (convnn.py); else a fixed ratio
        of the larger tensor (conv1d/3d too, on the flattened sizes)."""
        n = x_shape[0]
        key = (pas, tuple(x_shape[1:]), tuple(w_shape), tuple(stride), tuple(padding),
               tuple(dilation), groups)
        import torch

        pts = self.conv.get(key) if dtype == torch.float32 else None
        if pts:
            return value_at(pts, n)
        self.stats["conv_unmeasured"] += 1
        if self.rec is not None:
            self.rec.warn(CONV_ESTIMATED)
        if self.conv_ev:
            if self._conv_nn is None:
                self._conv_nn = Neighbours(self.conv_ev)
            ws = self._conv_nn.workspace(pas, list(x_shape[1:]), list(w_shape),
                                         list(out_shape[1:]), list(stride), list(dilation),
                                         transposed, groups, str(dtype).replace("torch.", ""),
                                         n)
            if ws is not None:
                return ws
        return fixed_workspace(self.row["conv_fallback_ratio"], pas, x_shape, w_shape,
                               out_shape, stride, itemsize)

    def conv_tokens(self, pas, x, w, bias, stride, padding, dilation, transposed, output_padding,
                    groups):
        """The measured events of this conv at x's batch, or None when its shape (or
        dtype) was not measured on this architecture."""
        if not self.conv_ev or x.dim() < 3:
            return None
        key = (pas, tuple(x.shape[1:]), tuple(w.shape), bool(bias), tuple(stride),
               tuple(padding), tuple(dilation), bool(transposed), tuple(output_padding),
               int(groups), str(x.dtype).replace("torch.", ""))
        # cuDNN picks other algorithms, with other workspaces, for channels_last (NHWC)
        # tensors: their own measurements where the table has them, else the NCHW ones
        # (an NHWC input with an NCHW weight, as ConvNeXt's downsampling convs get it, has
        # its own: cuDNN copies the weight to NHWC first; device run 38)
        cl = [t.dim() == 4 and not t.is_contiguous()
              and t.is_contiguous(memory_format=self._channels_last) for t in (x, w)]
        pts = self._conv_points(key, cl)
        if pts:
            self.stats["conv_measured"] += 1
            return tokens_at(pts, x.shape[0])
        if pas not in ("backward_input_only", "backward_weight_only"):
            return None
        # A backward that wants one gradient runs that half of the full backward's kernels,
        # same workspaces: where the full one's events split safely (the input's gradient
        # made first, its size known), one half stands in (all 58,590 input-only and 2,115
        # weight-only measurements of the H100 table equal their split; device run 39:
        # Whisper's first Conv1d on the features)
        full = self._conv_points(("backward",) + key[1:], cl)
        if not full:
            return None
        halves = split_backward(tokens_at(full, x.shape[0]), x.numel() * x.element_size())
        if halves is None:
            return None
        self.stats["conv_measured"] += 1
        return halves[0] if pas == "backward_input_only" else halves[1]

    def _conv_points(self, key, cl):
        """The measured points of a conv key in the layout cl ([input, weight] channels_last)
        calls for: its own layout's where the table has them, else the NCHW ones."""
        pts = None
        if cl[0] and not cl[1]:
            pts = self.conv_ev.get(key + ("channels_last_input",))
        if not pts and any(cl):
            pts = self.conv_ev.get(key + ("channels_last",))
        return pts or self.conv_ev.get(key + ("nchw",))

    def embedding_tokens(self, func, args):
        """An embedding backward's allocations as event tokens (embedding_tokens):
        embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq),
        _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size,
        maximum_indices, num_weights, scale_grad_by_freq, mode, sparse, ...) and its dense
        part (grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
        scale_grad_by_freq, mode, ...)."""
        a = self._aten
        g, idx = args[0], args[1]
        mode = 0
        if func == a.embedding_dense_backward.default:
            n_w, freq, bag = args[2], args[4] if len(args) > 4 else False, False
        elif func == a._embedding_bag_backward.default:
            if len(args) < 10 or args[9]:  # sparse gradients: another kernel
                return None
            n_w, freq, mode, bag = args[6], args[7], args[8], True
        else:
            n_w, freq, mode, bag = args[5], args[6], args[7], True
        if idx.dtype != self._i64 or g.dim() < 1 or int(mode) == 2:
            return None  # max mode: its own kernel
        toks = embedding_tokens(idx.numel(), int(n_w), int(g.shape[-1]), g.element_size(),
                                bool(freq), bag)
        if not idx.numel():
            return toks
        # indices.contiguous(), then grad.contiguous(), first; freed last, in reverse
        # (lm_large_vocab_ce's shifted targets; T5's permuted position-bias grad in
        # hx_t5_train_bf16's real backward; EmbeddingBag's, a slice of a cat's grad, in
        # ho_recsys_embbag_amp's)
        copies = [n for n, c in ((idx.numel() * idx.element_size(), bag or idx.is_contiguous()),
                                 (g.numel() * g.element_size(), g.is_contiguous())) if not c]
        if copies:
            k = len(copies)
            toks = [["t", c] for c in copies] + \
                shift_frees(toks or [["o", 0]], k) + \
                [["f", i] for i in reversed(range(k))]
        return toks

    def sorting_tokens(self, func, args, kwargs):
        """sort, topk, cumsum, isin and multinomial's allocations as event tokens (sorting.py), or None; raises
        UnsupportedOp where the case was not measured."""
        from . import sorting
        from .capture import UnsupportedOp

        kind = self.sorting[func]
        b = _bind(func, args, kwargs)
        if kind == "isin":
            test = b["test_elements"]
            el = b["elements"]
            if not hasattr(test, "device") or test.device.type != "cuda":
                return None
            toks = sorting.isin_tokens(el.numel() if hasattr(el, "numel") else 1, test.numel())
            if toks is None:
                self.rec.warn("not modelled: isin with a large test set (it sorts; its sort "
                              "buffers are transient)")
            return toks
        x = b["self"]
        if kind == "multinomial":
            if not hasattr(x, "device") or x.device.type != "cuda":
                return None
            rows, cols = (1, x.shape[0]) if x.dim() == 1 else (x.shape[0], x.shape[1])
            toks = sorting.multinomial_tokens(rows, cols, int(b["num_samples"]),
                                              bool(b.get("replacement")), x.element_size(),
                                              self.gpu.multi_processor_count)
            if toks is None:
                raise UnsupportedOp(func, "multinomial of more than %d samples without "
                                    "replacement (a sorted topk, not measured)" % sorting.MAX_SORTED_TOPK)
            return toks
        if not hasattr(x, "device") or x.device.type != "cuda":
            return None
        shape = list(x.shape)
        nd = max(1, len(shape))
        dim = b.get("dim", -1) % nd if shape else 0
        if kind == "sort":
            inner = x.is_contiguous() and (not shape or all(s == 1 for s in shape[dim + 1:]))
            toks, why = sorting.sort_tokens(shape, dim, x.element_size(), inner)
        elif kind == "topk":
            toks, why = sorting.topk_tokens(shape, dim, int(b["k"]), bool(b.get("sorted", True)),
                                            x.element_size(), self.gpu.multi_processor_count)
        else:
            import torch

            out = b.get("dtype") or (torch.int64 if not x.dtype.is_floating_point and
                                     not x.dtype.is_complex else x.dtype)
            return sorting.cumsum_tokens(x.numel(), shape[dim] if shape else 1,
                                         x.element_size(), out.itemsize, out != x.dtype)
        if toks is None:
            raise UnsupportedOp(func, why)
        return toks

    def unmodelled_warning(self, func, args, kwargs):
        """A warning for an op whose CUDA scratch is not modelled, or None."""
        why = self.unmodelled.get(func)
        if why is None or ("accumulate" in _arg_names(func) and
                           not _bind(func, args, kwargs).get("accumulate")):
            return None
        if func in self.adv_index and self.index_put_acc(func, args, kwargs) is not None:
            return None  # modelled (sorting.index_put_acc_tokens)
        return "not modelled: " + why

    def replay_tokens(self, toks, outs, frames, ws_key=None):
        """Replays measured events: outs (the fake op's cuda outputs, in the op's order)
        take the "o" places (["oi", i]: the i-th output, for a kernel that makes them in
        another order); transients are allocated and freed where measured. False
        (and nothing done) when the outputs do not match the measurement's. With ws_key (a
        cuDNN conv's plan key), a transient freed at once is that plan's workspace and is
        tagged as one (snapshot.py's note)."""
        rec = self.rec
        if sum(1 for k, _ in toks if k in ("o", "s", "oi")) != len(outs):
            return False
        toks = outputs_by_size(toks, [o.untyped_storage().nbytes() for o in outs])
        st = rec.current_stream_ident()
        it, temps = iter(outs), []
        for j, (k, v) in enumerate(toks):
            if k == "o":
                rec.see_storage(next(it).untyped_storage(), frames)
            elif k == "oi":  # the op's v-th output, made here (not in the op's order)
                rec.see_storage(outs[v].untyped_storage(), frames)
            elif k == "s":  # an output whose block is v bytes, more than its shape needs
                rec.see_storage(next(it).untyped_storage(), frames, size=v)
            elif k == "t":
                ws = ws_key is not None and j + 1 < len(toks) and \
                    toks[j + 1] == ["f", len(temps)]
                meta = workspace_tag(ws_key, j) if ws else None
                temps.append((rec.alloc(v, stream=st, frames=frames, meta=meta), v)
                             if v > 0 else None)
            else:
                t = temps[v]
                if t is not None:
                    rec.free(t[0], t[1], st)
        return True

    def conv_args(self, args, kwargs):
        # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        x, w = args[0], args[1]
        stride, padding, dilation, transposed, _, groups = args[3:9]
        return x, w, list(stride), list(padding), list(dilation), transposed, groups

    def uses_cudnn(self, x, transposed, w=None, groups=1):
        import torch

        if not (torch.backends.cudnn.enabled and x.dim() in (3, 4, 5) and not transposed):
            return False
        if w is not None and groups > 1 and x.dim() in (3, 4) and groups == x.shape[1] \
                and w.shape[0] % x.shape[1] == 0 and x.dtype != torch.float16:
            # depthwise (a Conv1d too, seen as 2-d: Mamba's): PyTorch's own CUDA kernel
            # (conv_depthwise2d), no cuDNN workspace; cuDNN for fp16, and always where
            # either tensor suggests channels_last
            # (ConvParams::use_cudnn_depthwise: ConvNeXt's bf16 depthwise convs on NHWC
            # data, hv_tv_convnext_train_bf16's real snapshot has no input copy)
            from torch._prims_common import suggest_memory_format

            return suggest_memory_format(x) != torch.contiguous_format or \
                suggest_memory_format(w) != torch.contiguous_format
        return True


def conv_plan_key(pas, x, w, stride, padding, dilation, groups):
    """What PyTorch's cuDNN plan cache keys a convolution by: the pass, the shapes (batch
    included), strides of the input (its memory format), the dtype and the conv's
    parameters."""
    k = "%s|%s|%s|%s|%s|%s|%s|%s|%s" % (
        pas, tuple(x.shape), tuple(x.stride()), tuple(w.shape), tuple(w.stride()),
        str(x.dtype).replace("torch.", ""), tuple(stride), tuple(padding),
        (tuple(dilation), int(groups)))
    return hashlib.blake2b(k.encode(), digest_size=8).hexdigest()


def workspace_tag(key, part):
    return "%s%s#%s" % (WORKSPACE_TAG, key, part)


def _overloads(aten, name):
    pkt = getattr(aten, name, None)
    return [getattr(pkt, o) for o in pkt.overloads()] if pkt is not None else []


def _flattens_as_view(t):
    """Whether t.reshape(-1) is a view: the dims longer than one are nested, each stride the
    next one's times its size."""
    dims = [(n, st) for n, st in zip(t.shape, t.stride()) if n != 1]
    return all(dims[k][1] == dims[k + 1][1] * dims[k + 1][0] for k in range(len(dims) - 1))


def strides_differ(shape, a, b):
    """Whether two stridings of `shape` differ in a dim longer than one."""
    return any(n != 1 and x != y for n, x, y in zip(shape, a, b))


def _arg_names(func):
    return [a.name for a in func._schema.arguments]


def _bind(func, args, kwargs):
    """{argument name: value} of an aten call, defaults filled in from its schema."""
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _ceil(a, m):
    return (a + m - 1) // m * m


def embedding_tokens(n, n_w, d, elem, freq=False, bag=False):
    """embedding_dense_backward's allocations over n int64 indices into a (n_w, d) table
    whose grad has `elem`-byte elements, as event tokens around its output (grad_weight),
    or None where the output is all (up to 3072 indices: one kernel into a zeroed
    grad_weight) or the path is unmeasured (scale_grad_by_freq: the output only). The sort
    path, as PyTorch 2.11 runs it on an H100 (scripts/trace_corpus/embbwd/h100-run2*.json;
    independent of the index values and of padding_idx): sorted and original positions and
    an arange (8n each) and cub's radix-sort scratch, the arange and scratch freed;
    grad_weight; segment offsets (8n), a count (8), unique_by_key's 8n and scratch, freed;
    two per-segment arrays over S = min(n, V) rows and a scan's scratch, freed; a count
    (8); partial-segment offsets over P = n // 10 + S; then the partial sums, P x d in fp32
    (the grad's dtype if wider), or, when V < 557 and P >= 4V (measured: dense at V 513 and
    at 32 indices a row, sums at V 600 and at 27), a second 8P and, for fp16/bf16, an fp32
    V x d accumulator. Everything but grad_weight is freed last to first, as measured.
    EmbeddingBag's dense backward (bag) takes the sort path at every n (its radix sort of
    up to one single-tile block of indices, 2304, needs one byte of scratch:
    sorting.cub_single_tile), measured from 1024 to 65536 indices,
    sum and mean."""
    if freq or (n <= 3072 and not bag):
        return None
    s = min(n, n_w)
    p = n // 10 + s
    a8 = 8 * n
    sort = 1 if cub_single_tile(n, 8) else _cub_sort_pairs(n)
    toks = [["t", a8], ["t", a8], ["t", a8], ["t", sort], ["f", 3], ["f", 2],
            ["o", 0],
            ["t", a8], ["t", 8], ["t", a8], ["t", _cub_lookback(n, 4608)], ["f", 7], ["f", 6],
            ["t", 8 * s], ["t", 8 * s], ["t", _cub_lookback(s, 896)], ["f", 10],
            ["t", 8], ["t", 8 * p]]
    if n_w < 557 and p >= 4 * n_w:
        toks.append(["t", 8 * p])
        if elem < 4:
            toks.append(["t", 4 * n_w * d])
    else:
        toks.append(["t", p * d * max(4, elem)])
    last = sum(1 for k, _ in toks if k == "t") - 1
    toks += [["f", i] for i in range(last, 12, -1)]
    toks += [["f", i] for i in (12, 11, 9, 8, 5, 4, 1, 0)]
    return toks


def _cub_sort_pairs(n):
    """cub's scratch for radix_sort_pairs of n int64 keys and values (the embedding
    backward's sort), as measured: both alternate buffers, the digit histograms, and 1 KiB
    of lookback per tile of 4608 items; exact at every measured n (embbwd/h100-run2*.json:
    3073 to 262144)."""
    return 2 * _ceil(8 * n, 256) + 16384 + 511 + 1024 * -(-n // 4608)


def _cub_lookback(n, tile):
    """cub's scratch for a single-pass scan or unique_by_key over n items: 16-byte tile
    states for the tiles and 32 warps of padding, 256-aligned, plus 511 of alignment slack
    (tiles of 4608 items for unique_by_key, 896 for exclusive_sum; exact on the measured n)."""
    return 511 + _ceil(16 * (-(-n // tile) + 32), 256)


def _pow2_floor(x):
    r = 1
    while r * 2 <= x:
        r *= 2
    return r


def cudnn_decode_workspace(b, hq, hk, s, dv):
    """cuDNN attention's workspace for one query row (a decode step): it splits a long key
    sequence across CTAs (flash-decoding) and keeps each split's partial output and
    softmax statistics in fp32. Splits: none up to 512 keys, else the smaller of the key
    length's 128-key blocks and 256 / (B x KV heads), as powers of two, none under 4;
    bytes: splits x B x Hq x Dv x 4 and splits x B x Hq x 8, each 256-aligned, plus 128.
    All 492 decode shapes of device run 28's grid match (scripts/trace_corpus/ops/
    ops-h100-run28.json: keys 128 to 4096, head dims 64 and 128, 1 to 64 sequences, MHA
    and GQA, with and without a mask, H100)."""
    if s <= 512:
        return 0
    splits = min(_pow2_floor(s / 128), _pow2_floor(256 / max(1, b * hk)))
    if splits < 4:
        return 0
    return _ceil(splits * b * hq * dv * 4, 256) + _ceil(splits * b * hq * 8, 256) + 128


def sdpa_backward_scratch(rec, func_name, args):
    """The fused attention backwards' kernel scratch, after the gradients (the meta twin's
    ops/attention.rs backward: measured for the memory-efficient kernel in f32 on GPT-2 and
    BERT and for cuDNN in bf16 on Llama GQA and DistilBERT; flash from its sources, an
    estimate)."""
    q, k, v = args[1], args[2], args[3]
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    Dv = v.shape[-1]
    st = rec.current_stream_ident()
    fr = rec._frames()

    def alloc(n):
        return (rec.alloc(n, stream=st, frames=fr), n)

    def free(*blocks):
        for a, n in blocks:
            rec.free(a, n, st)

    if func_name == "efficient":
        low = q.element_size() != 4
        casts = [alloc(B * T * Hq * Dv * 4), alloc(B * T * Hq * Dv * 4)] if low else []
        prod = alloc(B * T * Hq * Dv * 4)
        s = alloc(B * T * Hq * 4)
        delta = alloc(B * Hq * T * 4)
        free(s, prod, *casts)
        blocks = -(-T // 64)
        per_bh = blocks * 64 * _ceil(D, 64) * 4 + blocks * 16
        ws = alloc(B * Hq * per_bh)
        free(delta, ws)
    elif func_name == "flash":
        t128 = _ceil(T, 128)
        scratch = [alloc(B * Hq * t128 * 4), alloc(B * t128 * Hq * _ceil(D, 32) * 4)]
        if Hq != Hkv:
            scratch += [alloc(B * Hq * S * D * q.element_size()), alloc(B * Hq * S * Dv * q.element_size())]
        free(*scratch)
    else:
        # cuDNN's SDPA backward workspace, measured on the H100 (device runs 14 and 18:
        # Llama GQA and DistilBERT in bf16): the f32 dQ accumulator and softmax sums, plus,
        # with grouped heads, dK and dV over all query heads before they are summed
        n = B * Hq * T * (4 * D + 4) + 256
        if Hq != Hkv:
            n += B * Hq * S * (D + Dv) * q.element_size()
        free(alloc(n))
