"""The FakeTensorMode that records: each aten op's new cuda storages become allocations, in
the order PyTorch's CUDA kernels allocate them, with the library workspaces of hidden.py
between them. See capture.py for the design note.

Three rules decide what counts as one CUDA kernel: only the outermost op allocates (a fake
kernel's decomposition is one kernel on the GPU), except an op that is composite only (no CUDA
kernel of its own: conv2d, linear under inference_mode), whose parts are the kernels; and an
explicit composite with no CUDA kernel (logsumexp, cdist's _euclidean_dist, isinf) runs its C++
composite, whose at:: calls come back here as the kernels they are on the GPU. Small CPU
tensors made from nothing keep their real values (the host computes them for free, and model
code branches on them), so CPU-side arithmetic is exact; cuda tensors never hold data."""

import sys
import threading
import weakref

# Small CPU tensors (elements) whose values the trace keeps and propagates (see dispatch).
CPU_CONSTANT_LIMIT = 1 << 16
SCALAR_CHECK_PRESUMED = ("an ATen check of a computed condition on the GPU (is_scalar_tensor_true: "
                         "istft's window envelope) presumed passed")

_FakeMode = None


def _mode_class():
    global _FakeMode
    if _FakeMode is not None:
        return _FakeMode
    import torch
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensor,
        FakeTensorMode,
        UnsupportedOperatorException,
    )

    from .capture import UnsupportedOp
    from .values import FINITE_PRESUMED, UNKNOWN as _UNKNOWN, Values
    from .hidden import sdpa_backward_scratch
    from .native_mha import encoder_layer, native_mha
    from . import ctc, rnn
    from .datadep import known_outputs, mask_index_tokens

    aten = torch.ops.aten
    empty_memory_format = aten.empty.memory_format
    index_tensor = aten.index.Tensor
    local_scalar = aten._local_scalar_dense.default
    is_all_true = aten._is_all_true.default
    equal = aten.equal.default
    record_stream = aten.record_stream.default
    add_tensor = aten.add.Tensor
    pin_memory = aten._pin_memory.default
    is_pinned = aten.is_pinned.default
    add_inplace = aten.add_.Tensor
    index_put_func = aten.index_put.default
    index_put_impl = aten._index_put_impl_.default
    # autograd's backward formulas scatter into fresh zeros out of place for tensor subclasses
    # (areAnyTensorSubclassLike) and in place for plain tensors: topk/max/sort's
    # value_selecting_reduction_backward (scatter_), gather's (scatter_add_),
    # index_select's (index_add_)
    into_zeros = {aten.scatter.src: aten.scatter_.src, aten.scatter.value: aten.scatter_.value,
                  aten.scatter_add.default: aten.scatter_add_.default,
                  aten.index_add.default: aten.index_add_.default}
    # Tensor.to(...): CompositeImplicit, so it reaches the mode only where autograd's keys
    # are off (inference_mode). Fake mode's constant propagation would run it for real on a
    # constant CPU input (torch.tensor([...], device="cuda")), which needs the GPU; its guard
    # covers _to_copy, which `to` becomes when decomposed.
    to_ops = {getattr(aten.to, o) for o in aten.to.overloads()}
    # at::dropout and its kin return their input itself when they do nothing (eval, p = 0);
    # their Python decompositions, which fake mode runs where the composite reaches it
    # (inference_mode), clone it (ho_tv_swin_infer: a [B, H, N, N] copy per attention)
    # nn.MultiheadAttention's and nn.TransformerEncoderLayer's inference fast paths
    fast_paths = {aten._native_multi_head_attention.default: native_mha,
                  aten._transformer_encoder_layer_fwd.default: encoder_layer,
                  aten._cudnn_rnn_flatten_weight.default: rnn.flatten_weight,
                  aten._cudnn_rnn.default: rnn.cudnn_rnn,
                  aten._cudnn_rnn_backward.default: rnn.cudnn_rnn_backward,
                  aten._ctc_loss.default: ctc.forward,
                  aten._ctc_loss_backward.default: ctc.backward}
    dropouts = {aten.dropout.default, aten.feature_dropout.default,
                aten.alpha_dropout.default, aten.feature_alpha_dropout.default}
    ACC_USE_COUNT = 4
    CUDNN_BENCHMARK = ("torch.backends.cudnn.benchmark=True is not modelled: cuDNN's algorithm "
                       "search tries workspaces sized from the free memory and may settle on "
                       "another algorithm (a real H100 run of ResNet-18 training peaked at 3.8x "
                       "the benchmark=False prediction); trace with "
                       "torch.backends.cudnn.benchmark = False for that prediction")
    # outputs CUDA allocates, in order: cuDNN: seed, offset, output, stats with grad
    # (args[4] compute_log_sumexp); flash: output, logsumexp, rng state; efficient: output,
    # logsumexp with grad (seed/offset on the host).
    sdpa_bwd = {
        aten._scaled_dot_product_efficient_attention_backward.default: "efficient",
        aten._scaled_dot_product_flash_attention_backward.default: "flash",
        aten._scaled_dot_product_cudnn_attention_backward.default: "cudnn",
    }
    sdpa_plans = {
        aten._scaled_dot_product_cudnn_attention.default:
            lambda a: [6, 7, 0] + ([1] if a[4] else []),
        aten._scaled_dot_product_flash_attention.default: lambda a: [0, 1, 6],
        aten._scaled_dot_product_efficient_attention.default:
            lambda a: [0] + ([1] if a[4] else []),
    }
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense
    from torch._prims_common import make_channels_last_strides_for, make_contiguous_strides_for
    from torch._prims_common import suggest_memory_format
    from torch._prims_common import (
        are_strides_like_channels_last_or_false as are_like_channels_last)

    from . import composite as explicit
    from .hidden import conv_plan_key, strides_differ, with_grad_copies, workspace_tag, \
        wrap_copy
    from .reduce import layout_staging
    from .refuse import ONE_HOT_WHY, not_modelled_ops, on_fake_cuda

    not_modelled = not_modelled_ops()  # refused by name (refuse.py)
    grouped_mm = getattr(aten, "_grouped_mm", None)
    ln_backward = aten.native_layer_norm_backward.default
    HOST_RANDOM = {"aten::rand", "aten::randn", "aten::randint", "aten::randperm",
                   "aten::bernoulli", "aten::normal", "aten::uniform", "aten::multinomial"}
    grouped_mm = grouped_mm.default if grouped_mm is not None else None

    def hid_fast_grouped_mm(hid, args, kwargs):
        a = args[0]
        if not (isinstance(a, FakeTensor) and a.device.type == "cuda"):
            return True  # not the trace's: fake mode's own kernel
        return hid.grouped_mm_fast(args, kwargs)

    # CUDA kernels with no meta kernel whose outputs are plain empties. cuDNN's spatial
    # transformer (grid_sample, bilinear, zeros, align_corners=True, 4-d, C <= 1024): its
    # outputs are made empty and resized, so contiguous (cudnn/GridSampler.cpp); the grid's
    # contiguous copy is hidden.py's
    no_meta = {}
    if hasattr(aten, "cudnn_grid_sampler"):
        no_meta[aten.cudnn_grid_sampler.default] = lambda x, g: x.new_empty(
            (x.size(0), x.size(1), g.size(1), g.size(2)))
        no_meta[aten.cudnn_grid_sampler_backward.default] = lambda x, g, go: (
            x.new_empty(x.shape), g.new_empty(g.shape))
    # PyTorch's fused GRU cell (RNN.cu; nn.GRU in bfloat16, nn.GRUCell): no meta kernel; its
    # outputs are plain empties, the bias grads sums of the gates' grads
    no_meta[aten._thnn_fused_gru_cell.default] = lambda ig, hg, hx, ib=None, hb=None: (
        hx.new_empty(hx.shape), hx.new_empty((hx.size(0), hx.size(1) * 5)))
    no_meta[aten._thnn_fused_gru_cell_backward.default] = lambda ghy, ws, has_bias: (
        ws.new_empty((ws.size(0), ws.size(1) // 5 * 3)),
        ws.new_empty((ws.size(0), ws.size(1) // 5 * 3)), ghy.new_empty(ghy.shape)) + (
        (ws.new_empty(ws.size(1) // 5 * 3), ws.new_empty(ws.size(1) // 5 * 3)) if has_bias
        else (None, None))
    one_hot = aten.one_hot.default
    finiteness = {aten.isfinite.default: True, aten.isnan.default: False,
                  aten.isinf.default: False, aten.isposinf.default: False,
                  aten.isneginf.default: False}

    def _inplace_multi_tensor(func):
        name = func.name().split("::")[-1]
        return name.startswith(("_fused_", "_foreach_")) and not func._schema.returns and \
            func._schema.is_mutable

    def _grouped_mm_out(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
        # at::_grouped_mm_cuda's output (create_grouped_gemm_output_tensor: the last dim
        # padded to 16 bytes) for the operands its fallback takes (fp32, fp16, or any dtype
        # off Hopper), which fake mode's meta kernel refuses: it checks the CUTLASS kernel's
        # bf16 alone (transformers' MoE experts in fp32). Made at depth > 0: recorded below
        # as the op's output.
        a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
        if a2:
            size = [offs.size(0), mat_a.size(0), mat_b.size(1)] if b2 else \
                [mat_a.size(0), mat_b.size(-1)]
        else:
            size = [mat_a.size(1), mat_b.size(1)] if b2 else \
                [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
        dt = out_dtype or mat_a.dtype
        align = 16 // dt.itemsize
        padded = (size[-1] + align - 1) // align * align
        stride = [size[1] * padded, padded, 1] if a2 == b2 else [padded, 1]
        return mat_a.new_empty_strided(size, stride, dtype=dt)
    fake_errors = (DataDependentOutputException, DynamicOutputShapeException,
                   UnsupportedOperatorException)
    try:
        from torch._subclasses.fake_tensor import UnsupportedFakeTensorException
        fake_errors = fake_errors + (UnsupportedFakeTensorException,)
    except ImportError:
        pass

    def leaves(out, acc):
        if isinstance(out, FakeTensor):
            acc.append(out)
        elif isinstance(out, (tuple, list)):
            for o in out:
                leaves(o, acc)
        return acc

    composite_cache = {}

    def _flat(args, kwargs):
        import torch.utils._pytree as pytree

        return pytree.tree_leaves((args, kwargs))

    def _composite(func):
        c = composite_cache.get(func)
        if c is None:
            # composite only: an op with a CUDA kernel of its own (silu_backward has a math
            # fallback too) runs that kernel
            has = torch._C._dispatch_has_kernel_for_dispatch_key
            try:
                n = func.name()
                c = has(n, "CompositeImplicitAutograd") and not has(n, "CUDA") and \
                    not has(n, "CompositeExplicitAutograd")
            except Exception:  # noqa: BLE001 - an op the dispatcher does not know by name
                c = False
            composite_cache[func] = c
        return c

    from .capture import _SKIP

    engine_entry = ("/torch/autograd/graph.py", "/torch/autograd/__init__.py")

    def _python_caller():
        """Whether the op being dispatched was called by Python code (the innermost frame
        outside the dispatch machinery), other than the call that started the engine."""
        f = sys._getframe(1)
        while f is not None:
            fn = f.f_code.co_filename
            if not any(k in fn for k in _SKIP):
                return not any(fn.endswith(e) for e in engine_entry)
            f = f.f_back
        return False

    def _in_decomposition():
        """Whether a Python decomposition (torch/_decomp) is on the stack: at the outermost
        op, one that runs on the device too, op by op."""
        f = sys._getframe(1)
        while f is not None:
            if "/torch/_decomp/" in f.f_code.co_filename:
                return True
            f = f.f_back
        return False

    def cudnn_format(fa, fb, ndim):
        """cudnn_conv_suggest_memory_format: channels_last (3d for 5-d tensors) where either
        of the two suggested formats is, else contiguous."""
        if (fa == torch.contiguous_format and fb == torch.contiguous_format) or \
                ndim not in (4, 5):
            return torch.contiguous_format
        return torch.channels_last if ndim == 4 else torch.channels_last_3d

    def _grad_copies(go, x, w, mask, nbytes):
        """The grad_output copies cudnn_convolution_backward makes (ConvShared.cpp), as
        (top, input pass, weight pass) bytes: grad_output.to(input's suggested format)
        copies only where the two suggested formats differ; each pass then takes it
        .contiguous() in cuDNN's format for its pair of tensors (channels_last where
        either suggests it). A Conv1d is seen as convolution_backward sees it: the input
        made contiguous, all three unsqueezed to 2-d (a grad permuted back from
        [batch, time, channels] then suggests channels_last: Whisper's second conv).
        Device run 39: a WGAN-GP's expanded scalar grad (the input pass copies after
        making grad_input); DenseNet's grads sliced by cat's backward."""
        def view4d(t, contiguous=False):
            shape = list(t.shape)
            st = list(make_contiguous_strides_for(shape) if contiguous else t.stride())
            if len(shape) != 3:
                return shape, st
            return shape[:2] + [1] + shape[2:], st[:2] + [st[2] * shape[2]] + st[2:]

        g, xv, wv = view4d(go), view4d(x, x.dim() == 3), view4d(w)

        def suggest(shape, st):
            if len(shape) in (4, 5) and are_like_channels_last(shape, st):
                return torch.channels_last if len(shape) == 4 else torch.channels_last_3d
            return torch.contiguous_format

        def strides_in(shape, fmt):
            return make_contiguous_strides_for(shape) if fmt == torch.contiguous_format \
                else make_channels_last_strides_for(shape)

        def dense_in(shape, st, fmt):
            return not strides_differ(shape, st, strides_in(shape, fmt))

        xf = suggest(*xv)
        top = nbytes if suggest(*g) != xf else 0
        gf = xf if top else suggest(*g)
        g2 = (g[0], strides_in(g[0], xf)) if top else g

        nd = len(g[0])
        copy_in = nbytes if mask[0] and not dense_in(*g2, cudnn_format(gf, suggest(*wv), nd)) \
            else 0
        copy_w = nbytes if mask[1] and not dense_in(*g2, cudnn_format(xf, gf, nd)) else 0
        return top, copy_in, copy_w

    def _input_copy(hid, x, w, transposed, groups):
        """Bytes of the input copy _convolution makes before a CUDA conv (Convolution.cpp):
        input.contiguous(backend format) for cuDNN, input.contiguous() for the depthwise
        kernels; 0 where the input already is. Device run 39: a WGAN-GP's double backward
        convolves ggI.transpose(0, 1)."""
        if not isinstance(x, FakeTensor) or x.device.type != "cuda" or not x.numel():
            return 0
        if hid.uses_cudnn(x, transposed, w, groups) or (
                transposed and torch.backends.cudnn.enabled and x.dim() in (3, 4, 5)):
            fmt = cudnn_format(suggest_memory_format(x), suggest_memory_format(w), x.dim())
        else:
            fmt = torch.contiguous_format
        return 0 if x.is_contiguous(memory_format=fmt) else x.numel() * x.element_size()

    class RecordingFakeMode(FakeTensorMode):
        def __init__(self, rec, hidden):
            super().__init__(allow_non_fake_inputs=True)
            self._vr = rec
            self._vh = hidden
            self._depth = 0
            self._vals = Values()
            hidden.vals = self._vals  # a bool mask's count for index_put_ (datadep.py)
            # host tensors holding (or computed from) the trace's own random draws, by id
            self._drawn = weakref.WeakValueDictionary()
            self._fallback_cuda = False
            self._dry = False  # an explicit composite tried with nothing recorded
            self._in_composite = 0  # inside a composite that ran (its parts are trusted)
            # ops modelled as one call: never redispatched to their composite
            self._whole = hidden.modelled() | set(fast_paths) | set(sdpa_plans) | \
                set(sdpa_bwd) | to_ops | dropouts | set(not_modelled) | set(no_meta) | \
                set(into_zeros) | {
                    local_scalar, is_all_true, record_stream, pin_memory, is_pinned, one_hot,
                    add_tensor, add_inplace, index_put_func, index_put_impl,
                    aten.lift_fresh.default, aten.clone.default}
            rec.unknown_reads = 0
            rec.accumulations = 0

        def can_run_unsafe_fallback(self, func):
            # An op with no fake kernel runs its real kernel on zeros as a fallback: on the
            # host that works, on CUDA it needs a GPU (nn.TransformerEncoder's padding-mask
            # check, _nested_tensor_from_mask_left_aligned): refused by name instead
            if self._fallback_cuda:
                return False
            return super().can_run_unsafe_fallback(func)

        def __deepcopy__(self, memo):
            # copy.deepcopy of a fake tensor copies its __dict__, the mode with it
            # (nn.TransformerDecoder clones its layer); a copy shares the one trace
            return self

        def _validate_cache_key(self, func, args, kwargs):
            # A composite op's cached result would come back without its parts running, and
            # its parts are what CUDA allocates (layer_norm under inference_mode: the
            # native_layer_norm mean and rstd, from the second call on, in ho_tv_swin_infer)
            if _composite(func):
                from torch._subclasses.fake_tensor import _BypassDispatchCache

                raise _BypassDispatchCache("composite: its parts allocate")
            return super()._validate_cache_key(func, args, kwargs)

        # Keep the no-op CUDA guard although torch.cuda.is_available() answers True under
        # the trace.
        avoid_device_init = property(lambda self: True)

        def dispatch(self, func, types, args=(), kwargs=None):
            rec = self._vr
            kwargs = kwargs or {}
            if func in to_ops:
                with self:
                    return func.decompose(*args, **kwargs)
            parts = fast_paths.get(func)
            if parts is not None and not self._depth and rec.active and \
                    on_fake_cuda(args, kwargs):
                # a fused op whose fake kernel makes the output alone (or that has none):
                # native_mha.py runs the CUDA kernel's parts, each recorded as the
                # outermost op it is there
                with self:
                    return parts(self._vh.row, rec, args, kwargs)
            if func in dropouts and (not args[2] or args[1] == 0 or args[0].numel() == 0):
                return args[0]
            if func is local_scalar:
                t = args[0]
                if t.dtype == torch.bool and self._drawn.get(id(t)) is t:
                    # the trace's own draw, not the GPU run's, decides a branch (LayerDrop's
                    # torch.rand([]) < p in Wav2Vec2's encoder, device run 40): it may run
                    # other layers here than there
                    rec.warn("control flow on a random host value (the trace's own draw, "
                             "not the GPU run's: LayerDrop, random augmentation) may differ "
                             "from the GPU run's")
                v = self._vals.get(t)
                if v is not _UNKNOWN:
                    return v
                # No data and no known value: numbers answer 1 (a step counter, a divisor),
                # booleans False (a nan/inf check passes). Counted in Trace.warnings.
                rec.unknown_reads += 1
                if rec.unknown_reads > 100000:
                    raise UnsupportedOp(func, "the program keeps reading tensor values the "
                                        "fake run does not have (control flow that depends "
                                        "on data, e.g. a loop until a condition holds)")
                if t.dtype == torch.bool:
                    rec.warn("bool(t) / t.item() of a fake %s bool tensor answered False" % t.device.type)
                    return False
                rec.warn("t.item() / t.tolist() of a fake %s tensor answered 1" % t.device.type)
                if t.dtype.is_floating_point:
                    return 1.0
                return 1
            if func is one_hot and (args[1] if len(args) > 1 else kwargs.get(
                    "num_classes", -1)) == -1 and on_fake_cuda(args, kwargs):
                raise UnsupportedOp(func, ONE_HOT_WHY)  # (reached under inference_mode)
            why = not_modelled.get(func)
            if why is not None and on_fake_cuda(args, kwargs):
                raise UnsupportedOp(func, why)
            if func is pin_memory:
                # page-locked host memory: not the GPU's, and a fake tensor has no pages
                return args[0]
            if func is is_pinned:
                return False
            if func is record_stream:
                t = args[0]
                if isinstance(t, FakeTensor) and t.device.type == "cuda":
                    rec.record_stream(t.untyped_storage(), args[1])
                return None
            if func is add_tensor and not self._depth and rec.linear_bias_add:
                # at::linear's bias add under autocast (api._make_linear): in place, as for
                # plain tensors; autograd's AddBackward0 takes the output's place as in-place
                # ops do
                rec.linear_bias_add = False
                func = add_inplace
            elif func is add_tensor and not self._depth and self._vr.active and \
                    threading.get_ident() != rec.main_ident and self._accumulates(args, kwargs):
                # autograd's InputBuffer::accumulate: on CUDA the engine adds a second
                # gradient into the first in place when it holds the only reference
                # (`old_var.add_(var)`); for tensor subclasses it never does, so a fake run
                # would allocate a sum the GPU does not.
                func = add_inplace
                rec.accumulations += 1
            if func is index_put_func and not self._depth and self._vr.active and \
                    threading.get_ident() != rec.main_ident and len(args) > 3 and args[3]:
                # autograd's index_backward: for tensor subclasses an out-of-place, checked
                # index_put of its fresh zeros; on CUDA _index_put_impl_(zeros, ..., True,
                # unsafe=True) in place (ho_gather_scatter_einsum's x[nbr] backward)
                func = index_put_impl
                args = (args[0], args[1], args[2], True, True)
            if func in into_zeros and not self._depth and self._vr.active and \
                    threading.get_ident() != rec.main_ident and args and \
                    isinstance(args[0], FakeTensor) and args[0].device.type == "cuda" and \
                    self._vals.known(args[0]) == 0 and dense(args[0]) and \
                    not _in_decomposition():
                # (hq_mixtral_moe_fp32_bf16's real router backward: topk's zeros and its
                # scatter are one [tokens, experts] block, not two). A Python decomposition
                # run for real (torch.func's batching rules: nll_loss_backward's
                # `torch.scatter(zeros_like(self), ...)`) scatters out of place, as on the GPU
                # (ht_func_per_sample_grads, device run 40).
                func = into_zeros[func]
                rec.accumulations += 1
            if func is equal and len(args) == 2 and on_fake_cuda(args, kwargs) and all(
                    isinstance(a, FakeTensor) and a.dim() == 0 and a.dtype == torch.bool
                    for a in args):
                # at::is_scalar_tensor_true(flag): ATen's own checks of a computed condition
                # (istft's window envelope, NOLA) ask equal(flag, true); a fake flag has no
                # value: the check is presumed passed (flag false), as the program meant
                rec.warn(SCALAR_CHECK_PRESUMED)
                return False
            if not self._depth and (rec.active or self._dry) and on_fake_cuda(args, kwargs) and \
                    explicit.redispatched(func, args, kwargs, self._whole) and \
                    (self._dry or self._in_composite or self._dry_run(func, args, kwargs)):
                return self._run_composite(func, args, kwargs)
            # Only the outermost op allocates: what a fake kernel runs inside (a
            # decomposition for an op with no meta kernel) is one CUDA kernel on the GPU.
            # A CompositeImplicitAutograd op (conv2d, linear, ...) is no kernel: it reaches
            # this mode only where autograd's keys are off (inference_mode), and its parts
            # are the kernels CUDA runs, so it does not count as the outermost op.
            composite = not self._depth and _composite(func)
            if not composite:
                self._depth += 1
            # decided here, not kept as the arguments: a reference to them would keep
            # their tensors alive (and defeat _accumulates' use counts)
            self._fallback_cuda = on_fake_cuda(args, kwargs)
            sized_toks = None  # datadep.py's tokens for an op it sized
            try:
                if func is grouped_mm and not hid_fast_grouped_mm(self._vh, args, kwargs):
                    out = _grouped_mm_out(*args, **kwargs)
                elif func in no_meta and self._fallback_cuda:
                    out = no_meta[func](*args)
                else:
                    out = super().dispatch(func, types, args, kwargs)
            except fake_errors as e:
                if type(e).__name__ == "UnsupportedOperatorException" and \
                        _inplace_multi_tensor(func) and self._fallback_cuda:
                    # a fused optimizer step with no meta kernel (_fused_sgd_, Adam's
                    # tensor-lr overloads): multi_tensor_apply updates the lists in place
                    # and allocates nothing, so it needs no fake kernel either
                    return None
                known = None
                if type(e).__name__ == "DynamicOutputShapeException":
                    # sized by values the trace knows (datadep.py)
                    base = super().dispatch
                    known = known_outputs(
                        self._vals, func, args, kwargs,
                        lambda shape, dtype, device: base(
                            empty_memory_format, types, (list(shape),),
                            {"dtype": dtype, "device": device}),
                        self._vh.gpu.multi_processor_count)
                if known is not None:
                    out, sized_toks = known
                else:
                    why = {
                        "DataDependentOutputException": "its result depends on tensor values, which a fake run does not have",
                        "DynamicOutputShapeException": "its output shape depends on tensor values the trace does not know (data-dependent shape)",
                        "UnsupportedOperatorException": "the op has no fake/meta kernel",
                    }.get(type(e).__name__, type(e).__name__)
                    raise UnsupportedOp(func, why) from None
            finally:
                if not composite:
                    self._depth -= 1
            if self._depth or not rec.active:
                return out
            if isinstance(out, FakeTensor) and out.layout != torch.strided and \
                    out.device.type == "cuda":
                raise UnsupportedOp(func, "sparse and other non-strided CUDA tensors are not "
                                    "modelled")
            if isinstance(out, FakeTensor) and out.device.type == "cpu" and \
                    out.numel() <= CPU_CONSTANT_LIMIT and out.constant is None and \
                    not any(isinstance(a, torch.Tensor) for a in _flat(args, kwargs)):
                # A small CPU tensor made from nothing (arange, zeros, tensor(...)): the
                # host has its values for free, and programs compute with them (a model's
                # layer widths, a sampler's indices) before anything reaches the GPU. Made
                # for real, kept as the fake's constant, they propagate through the ops
                # that follow (fake mode's constant propagation, its limit raised to the
                # same size for the trace) and .item()/.tolist() read them.
                from torch._subclasses.fake_tensor import unset_fake_temporarily

                with unset_fake_temporarily():
                    real = func(*args, **kwargs)
                if isinstance(real, torch.Tensor) and real.device.type == "cpu":
                    out = self.fake_tensor_converter.from_real_tensor(self, real, make_constant=True)
                    if func._schema.name in HOST_RANDOM:
                        self._drawn[id(out)] = out
                return out
            if self._drawn and isinstance(out, FakeTensor) and out.device.type == "cpu" and \
                    any(self._drawn.get(id(a)) is a for a in _flat(args, kwargs)):
                self._drawn[id(out)] = out  # computed from a draw (`rand([]) < p`)
            if composite:
                # its parts recorded themselves; outputs the fake kernel made without
                # dispatching parts (a meta implementation) are recorded here
                self._vals.after(func, args, kwargs, out)
                self._see_new_outputs(out)
                return out
            if func is ln_backward and isinstance(out[0], FakeTensor) and \
                    out[0].device.type == "cuda" and not out[0].is_contiguous():
                # layer_norm_backward_cuda makes dX empty_like(X.contiguous()): contiguous,
                # where the fake kernel follows the grad's layout (swin_t's final norm
                # behind a permute: hu_tv_swin_t_train_bf16's real backward has no copy
                # before the next matmul)
                self._depth += 1  # made here, recorded as the op's output below
                try:
                    out = (torch.empty_like(out[0], memory_format=torch.contiguous_format),
                           ) + tuple(out[1:])
                finally:
                    self._depth -= 1
            if func in self._vh.conv_fwd or func in self._vh.conv_bwd:
                out = self._cudnn_layout(func, args, out)
                if torch.backends.cudnn.benchmark and on_fake_cuda(args, kwargs):
                    # cuDNN's algorithm search: its trial workspaces come from the caching
                    # allocator, sized from what it has free (device run 29:
                    # hy_resnet18_train_cudnn_benchmark peaked at 3429 MiB allocated where
                    # benchmark=False's prediction was 898): refused, not guessed
                    raise UnsupportedOp(func, CUDNN_BENCHMARK)
            self._vals.after(func, args, kwargs, out)
            finite = finiteness.get(func)
            if finite is not None and isinstance(out, FakeTensor) and \
                    self._vals.known(out) is None:
                # a finiteness check of fake data (bart's fp16 `isfinite(h).all()` before its
                # clamp, a loss's isnan): presumed healthy, as a run that gets that far is
                self._vals.presume(out, finite)
                rec.warn(FINITE_PRESUMED)
            if func is is_all_true and isinstance(out, FakeTensor) and \
                    self._vals.known(out) is None:
                # torch.distributions' argument and sample validation (`_is_all_true` of a
                # support check): presumed valid, as a run that gets past it is
                self._vals.presume(out, True)
                rec.warn("a validity check (torch._is_all_true) of fake data presumed True")
            hid = self._vh
            plan = sdpa_plans.get(func)
            if plan is not None:
                # The fused attention kernels: what CUDA allocates, in its order (the
                # meta kernels also return the host-side RNG scalars, and the stats
                # without grad).
                want = plan(args)
                fr = rec._frames()
                for i in want:
                    if isinstance(out[i], FakeTensor):
                        rec.see_storage(out[i].untyped_storage(), fr)
                for i, o in enumerate(out):
                    if i not in want and isinstance(o, FakeTensor) and o.device.type == "cuda":
                        rec.ignore_storage(o.untyped_storage())
                return out
            if func in hid.conv_bwd:
                self._conv_backward(args, out)
                return out
            xcopy = None  # a conv's input copy, freed after its workspace
            if func in hid.conv_fwd and isinstance(out, FakeTensor) and out.device.type == "cuda":
                # convolution(input, weight, bias, stride, padding, dilation, transposed,
                #             output_padding, groups)
                x, w = args[0], args[1]
                toks = hid.conv_tokens("forward", x, w, args[2] is not None, *args[3:9])
                key = conv_plan_key("forward", x, w, args[3], args[4], args[5], args[8])
                xcopy = _input_copy(hid, x, w, args[6], args[8])
                if toks is not None and xcopy:
                    toks = wrap_copy(toks, xcopy, True, False)
                if toks is not None and hid.replay_tokens(toks, [out], rec._frames(), key):
                    return out
                if xcopy:
                    xcopy = (rec.alloc(xcopy, frames=rec._frames()), xcopy,
                             rec.current_stream_ident())
            ts = leaves(out, [])
            if func in hid.output_order and len(ts) == len(hid.output_order[func]):
                ts = [ts[i] for i in hid.output_order[func]]
            fr = None
            cuda_outs = [t for t in ts if t.device.type == "cuda"]
            sb = sdpa_bwd.get(func)
            go_copy = None
            if sb == "efficient" and args and isinstance(args[0], FakeTensor) and \
                    args[0].device.type == "cuda" and args[0].dim() == 4 and \
                    not args[0].transpose(1, 2).is_contiguous():
                # the kernel reads grad_out as [B, T, H, D]: a gradient in another layout
                # (nn.MultiheadAttention's permute back) is copied before the gradients and
                # freed after the kernel's scratch (ckpt_transformer_blocks' real snapshot)
                n = args[0].numel() * args[0].element_size()
                go_copy = (rec.alloc(n, frames=rec._frames()), n, rec.current_stream_ident())
            # what the CUDA kernel allocates around its outputs (input copies, reduction
            # staging), in hidden.py's event tokens
            if func is index_tensor and sized_toks is None:
                sized_toks = mask_index_tokens(self._vals, args)  # x[mask] (datadep.py)
            toks = hid.embedding_tokens(func, args) if func in hid.emb_bwd else sized_toks
            if func in hid.sorting:
                toks = hid.sorting_tokens(func, args, kwargs)
            elif func in hid.unmodelled:
                w = hid.unmodelled_warning(func, args, kwargs)
                if w is not None:
                    rec.warn(w)
            if toks is None:
                toks = hid.around_outputs(func, args, kwargs, len(cuda_outs))
            if toks:
                fr = rec._frames()
                hid.replay_tokens(toks, cuda_outs, fr)
            else:
                for t in cuda_outs:
                    if fr is None:
                        fr = rec._frames()
                    rec.see_storage(t.untyped_storage(), fr)
            if func._schema.is_mutable and fr is None:
                # in place on an input whose storage may have been resized (resize_, set_)
                for a in args:
                    if isinstance(a, FakeTensor) and a.device.type == "cuda":
                        e = rec.live.get(a.untyped_storage()._cdata)
                        if e is not None and e.nbytes != a.untyped_storage().nbytes():
                            rec.see_storage(a.untyped_storage(), rec._frames())
            if sb is not None:
                sdpa_backward_scratch(rec, sb, args)
            if go_copy is not None:
                rec.free(*go_copy)
            if func in hid.matmul:
                if args and isinstance(args[0], FakeTensor) and args[0].device.type == "cuda":
                    hid.matmul_after(func, args, kwargs)
            elif func in hid.conv_fwd:
                x, w, stride, padding, dilation, transposed, groups = hid.conv_args(args, kwargs)
                if x.device.type == "cuda" and hid.uses_cudnn(x, transposed, w, groups):
                    ws = hid.conv_workspace("forward", list(x.shape), list(w.shape),
                                            list(out.shape), stride, padding, dilation, groups,
                                            x.dtype, x.element_size(), transposed)
                    rec.hidden_temp(ws, frames=fr, meta=workspace_tag(conv_plan_key(
                        "forward", x, w, stride, padding, dilation, groups), 0))
            if xcopy:
                rec.free(*xcopy)
            return out

        def _dry_run(self, func, args, kwargs):
            """Whether func's composite runs on these fake arguments, tried with nothing
            recorded (a composite can need what a fake tensor lacks: `repeat` of a 0-dim
            tensor reads its data). A refusal inside it is the trace's refusal. An op that
            mutates its arguments is not tried twice: it runs its fake kernel, unless a
            composite tried before it calls it (logsumexp's logsumexp.out)."""
            if func._schema.is_mutable:
                return False
            rec = self._vr
            was, rec.active, self._dry = rec.active, False, True
            try:
                with self:
                    explicit.run(func, args, kwargs)
                return True
            except UnsupportedOp:
                raise
            except Exception:  # noqa: BLE001 - the fake kernel runs instead
                return False
            finally:
                rec.active, self._dry = was, False

        def _run_composite(self, func, args, kwargs):
            """An explicit composite (composite.py) run as its C++ composite, parts recorded."""
            rec = self._vr
            self._in_composite += 1
            try:
                with self:
                    out = explicit.run(func, args, kwargs)
            finally:
                self._in_composite -= 1
            if not rec.active:
                return out  # a dry run's
            self._vals.after(func, args, kwargs, out)
            finite = finiteness.get(func)
            if finite is not None and isinstance(out, FakeTensor) and \
                    self._vals.known(out) is None:
                self._vals.presume(out, finite)  # isinf's abs() == inf, as below
                rec.warn(FINITE_PRESUMED)
            self._see_new_outputs(out)
            return out

        def _see_new_outputs(self, out):
            """Records the cuda outputs whose storages no part recorded (a composite's)."""
            rec, fr = self._vr, None
            for t in leaves(out, []):
                if t.device.type == "cuda" and t.untyped_storage()._cdata not in rec.live:
                    if fr is None:
                        fr = rec._frames()
                    rec.see_storage(t.untyped_storage(), fr)

        def _accumulates(self, args, kwargs):
            if len(args) != 2 or kwargs.get("alpha", 1) != 1 or torch.is_grad_enabled():
                return False
            a, b = args
            if not (isinstance(a, FakeTensor) and isinstance(b, FakeTensor)):
                return False
            if a.device.type != "cuda" or a.shape != b.shape or a.dtype != b.dtype:
                return False
            # can_accumulate_inplace: non-overlapping and dense in any layout (a
            # channels_last gradient too: hx_resnet50_channels_last_bf16's residual sums)
            if a.requires_grad or a._base is not None or not dense(a):
                return False
            if _python_caller():
                # a custom Function's backward adding two of its own temporaries (BLOOM's
                # bloom_gelu_back: `... + 0.5 * (1 + tanh_out)`, real H100 run): Python
                # code, not the engine's InputBuffer, which calls add from C++
                return False
            # the engine's buffer, the dispatcher's argument and the Python wrapper: no
            # other holder (a .grad, a saved tensor, a second edge of the same gradient)
            return a._use_count() <= ACC_USE_COUNT and torch._C._storage_Use_Count(
                a.untyped_storage()._cdata) <= 2

        def _cudnn_layout(self, func, args, out):
            """A bf16 convolution's outputs in the memory format cuDNN gives them.
            PyTorch picks a bf16 conv's backend by asking the device whether cuDNN v8 takes
            bf16 (supportsBFloat16ConvolutionWithCuDNNv8); with no device the answer is no,
            so fake mode lays the outputs out as the slow kernel would (NCHW) where the
            GPU's cuDNN gives channels_last ones for channels_last inputs, and what
            follows (batch norm's channels-last kernels, .contiguous() copies) differs
            (hx_resnet50_channels_last_bf16's real snapshot). Such outputs are re-made
            with cuDNN's strides before they are recorded."""
            hid = self._vh
            fwd = func in hid.conv_fwd
            x, w = (args[0], args[1]) if fwd else (args[1], args[2])
            transposed = args[6] if fwd else args[7]
            groups = args[8] if fwd else args[9]
            if not (isinstance(x, FakeTensor) and x.device.type == "cuda" and
                    x.dtype == torch.bfloat16 and self._vr.gpu.major >= 8 and
                    x.dim() in (4, 5)):
                return out
            if not transposed and not hid.uses_cudnn(x, transposed, w, groups):
                return out
            backend = torch._C._ConvBackend.CudnnTranspose if transposed else \
                torch._C._ConvBackend.Cudnn
            fmt = torch._C._conv_determine_backend_memory_format(x, w, backend)
            if fmt == torch.contiguous_format:
                return out

            def restride(t):  # grad_weight too: cuDNN makes it in the same format
                if not isinstance(t, FakeTensor) or t.is_contiguous(memory_format=fmt):
                    return t
                self._depth += 1  # made here, recorded as the op's output below
                try:
                    return torch.empty_like(t, memory_format=fmt)
                finally:
                    self._depth -= 1

            if fwd:
                return restride(out)
            gi, gw, gb = out
            return restride(gi), restride(gw), gb

        def _conv_backward(self, args, out):
            rec, hid = self._vr, self._vh
            # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
            #                      dilation, transposed, output_padding, groups, output_mask)
            go, x, w = args[0], args[1], args[2]
            stride, padding, dilation, transposed = args[4], args[5], args[6], args[7]
            groups = args[9]
            gi, gw, gb = out
            fr = rec._frames()
            mask = args[10]
            pas = ("backward" if mask[0] and mask[1] else "backward_weight_only" if mask[1]
                   else "backward_input_only")
            # bias_sizes: [0] without a bias (autograd's convention), [C] with one
            has_bias = args[3] is not None and list(args[3]) != [0]
            toks = hid.conv_tokens(pas, x, w, has_bias, stride, padding, dilation,
                                   transposed, args[8], groups)
            outs = [t for t in (gi, gw, gb) if t is not None and t.device.type == "cuda"]
            cud = x.device.type == "cuda" and hid.uses_cudnn(x, transposed, w, groups)
            nbytes = go.numel() * go.element_size()
            top = copy_in = copy_w = 0
            # PyTorch's depthwise kernel (conv_depthwise2d_backward) takes grad_output
            # .expect_contiguous() first and makes grad_weight before grad_input
            dw_native = x.device.type == "cuda" and not cud and not transposed and \
                x.dim() in (3, 4) and groups > 1 and groups == x.shape[1]
            if cud and nbytes:
                top, copy_in, copy_w = _grad_copies(go, x, w, mask, nbytes)
            elif dw_native and nbytes:
                top = 0 if go.is_contiguous() else nbytes
            elif transposed and nbytes and x.device.type == "cuda" and \
                    torch.backends.cudnn.enabled and x.dim() in (3, 4, 5):
                # cudnn_convolution_transpose_backward makes grad_output contiguous in the
                # input's format first, freed before the bias's grad (ho_unet_decoder_sgd's
                # ConvTranspose2d: a grad sliced by cat's backward, in its real snapshot)
                fmt = torch.channels_last if go.dim() == 4 and any(
                    t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
                    for t in (x, w)) else torch.contiguous_format
                top = 0 if go.is_contiguous(memory_format=fmt) else nbytes
            # the input's copy (Convolution.cpp's convolution_backward): a Conv1d's input
            # .contiguous() before its view to 2-d, kept to the end (after the bias's grad);
            # for cuDNN, input.contiguous(backend format) where the weight's grad is wanted,
            # made before the backend's copies and freed after them (ShuffleNetV2's convs on
            # a chunk of channels: device run 39)
            xcopy, outer = 0, False
            if x.device.type == "cuda" and x.numel() and x.dim() == 3:
                xcopy, outer = (0 if x.is_contiguous() else x.numel() * x.element_size()), True
            elif mask[1] and (cud or transposed):
                xcopy = _input_copy(hid, x, w, transposed, groups)
            # the bias grad is grad_output summed over all dims but the channels', as laid
            # out (not the copy): Reduce.cuh's staging after it, where it splits. The
            # measured events (a contiguous grad) hold the contiguous layout's.
            keep1 = [d for d in range(go.dim()) if d != 1]
            bias_st = layout_staging(go.shape, go.stride(), go.storage_offset(), go.dtype,
                                     keep1, hid.gpu) if gb is not None and go.dim() > 1 else None
            if toks is not None and (top or copy_in or copy_w):
                copied = with_grad_copies(toks, pas, x.numel() * x.element_size(), top,
                                          copy_in, copy_w, gb is not None)
                if copied is None:  # the halves do not split: one copy around them all
                    copied = with_grad_copies(toks, "backward_weight_only", 0,
                                              top or nbytes, 0, 0, gb is not None)
                toks = copied
                fmt = suggest_memory_format(x) if cud else torch.contiguous_format
                dense = make_channels_last_strides_for(go.shape) \
                    if fmt is torch.channels_last else make_contiguous_strides_for(go.shape)
                if gb is not None and toks and toks[-1][0] == "o" and bias_st and \
                        not layout_staging(go.shape, dense, 0, go.dtype, keep1, hid.gpu):
                    n_t = sum(1 for k, _ in toks if k == "t")
                    toks = toks + [["t", bias_st[0]], ["t", bias_st[1]], ["f", n_t + 1],
                                   ["f", n_t]]
            if toks is not None and xcopy:
                toks = wrap_copy(toks, xcopy, outer, gb is not None)
            key = conv_plan_key(pas, x, w, stride, padding, dilation, groups)
            if toks is not None and hid.replay_tokens(toks, outs, fr, key):
                return
            st = rec.current_stream_ident()
            xtmp = rec.alloc(xcopy, stream=st, frames=fr) if xcopy else None
            tmp = rec.alloc(top, stream=st, frames=fr) if top else None
            shape = lambda t: list(t.shape)
            def input_grad():
                rec.see_storage(gi.untyped_storage(), fr)
                c = rec.alloc(copy_in, stream=st, frames=fr) if copy_in else None
                if cud:
                    rec.hidden_temp(hid.conv_workspace(
                        "backward_input", shape(x), shape(w), shape(go), list(stride),
                        list(padding), list(dilation), groups, x.dtype, x.element_size(),
                        transposed), fr, workspace_tag(key, "input"))
                if c is not None:
                    rec.free(c, copy_in, st)

            def weight_grad():
                c = rec.alloc(copy_w, stream=st, frames=fr) if copy_w else None
                rec.see_storage(gw.untyped_storage(), fr)
                if cud:
                    rec.hidden_temp(hid.conv_workspace(
                        "backward_weight", shape(x), shape(w), shape(go), list(stride),
                        list(padding), list(dilation), groups, x.dtype, x.element_size(),
                        transposed), fr, workspace_tag(key, "weight"))
                if c is not None:
                    rec.free(c, copy_w, st)

            for part, t in ((weight_grad, gw), (input_grad, gi)) if dw_native else \
                    ((input_grad, gi), (weight_grad, gw)):
                if t is not None:
                    part()
            if tmp is not None:
                rec.free(tmp, top, st)
            if xtmp is not None and not outer:
                rec.free(xtmp, xcopy, st)
            if gb is not None:
                rec.see_storage(gb.untyped_storage(), fr)
                if bias_st:
                    buf = rec.alloc(bias_st[0], stream=st, frames=fr)
                    sem = rec.alloc(bias_st[1], stream=st, frames=fr)
                    rec.free(sem, bias_st[1], st)
                    rec.free(buf, bias_st[0], st)
            if xtmp is not None and outer:
                rec.free(xtmp, xcopy, st)

    _FakeMode = RecordingFakeMode
    return _FakeMode


def make_mode(rec, hidden):
    return _mode_class()(rec, hidden)
