"""`F.scaled_dot_product_attention` as the target GPU would run it.

On a machine with no device PyTorch's `_fused_sdp_choice` cannot read the GPU's properties
and falls back to the math composite, which allocates the [B, H, T, S] scores a fused kernel
never does. The tracer makes the choice itself, by the rule the meta twin measured on Hopper
(crates/vramroom-tensor/src/ops/attention.rs, `sdpa_backend`), restricted by
`torch.backends.cuda.*_sdp_enabled()` (so `sdpa_kernel(...)` contexts are honoured), and calls
that backend's aten op, whose fake kernel returns the tensors the CUDA kernel allocates
(output in [B, T, H, D] memory order, logsumexp, RNG state); autograd saves what that op's
derivative saves. A boolean mask is converted as PyTorch's `convert_boolean_attn_mask` does
(a scalar -inf, where(mask, 0.0, it)).

The math path is run here too, as PyTorch 2.11's `_scaled_dot_product_attention_math`
runs it for real tensors: its C++ adds the mask out of place for tensor subclasses
(`areAnyTensorSubclassLike`), so a fake run would allocate a [B, H, T, S] sum the GPU adds in
place into the scores (T5's position bias: one 32 MiB block per layer in hx_t5_train_bf16's
real snapshot). `_safe_softmax`'s own temporaries are hidden.py's.

A mask the memory-efficient kernel cannot read in place is padded first (`_preprocess_mask`).
Not modelled: the head-dim padding copy PyTorch makes when D is not a multiple of 8, and
nested/jagged inputs (refused by the fake kernels).
"""

import math

from .hidden import cudnn_decode_workspace


def choose(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa, row):
    import torch

    b = torch.backends.cuda
    low = q.dtype in (torch.bfloat16, torch.float16)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "math"
    B, Hq, T, D = q.shape
    S, Dv = k.shape[-2], v.shape[-1]
    Hkv = k.shape[1]
    dims_ok = lambda m: D % m == 0 and Dv % m == 0
    gqa = Hq != Hkv
    if gqa and not enable_gqa:
        return "math"
    if attn_mask is not None and attn_mask.stride(-1) != 1:
        # check_last_dim_stride_equals_1_dense: every fused kernel on CUDA wants the mask's
        # last dim dense. T5's position bias is [T, S, H] permuted (stride(-1) == H), and so
        # is its sum with the padding mask: the H100 ran T5's encoder and decoder
        # self-attention on math and its cross-attention (a zeros bias, dense) on cuDNN
        # (hn_t5_beam_generate, hx_t5_train_bf16 in device runs 24 and 27)
        return "math"
    if any(t.stride(-1) != 1 for t in (q, k, v)) and not (D == 1 and Dv == 1):
        return "math"
    if low:
        # PyTorch's check_cudnn_deterministic: dropout keeps cuDNN out only under
        # deterministic algorithms (device run 18: DistilBERT's dropout 0.1 ran on cuDNN:
        # 2.11 has no later versions' check that the probability be in sixteenths)
        dropout_ok = not (dropout_p > 0.0 and torch.are_deterministic_algorithms_enabled())
        if row.get("sdpa_cudnn_first") and b.cudnn_sdp_enabled() and S > 1 and dims_ok(8) \
                and D <= 256 and Dv <= 256 and dropout_ok and _cudnn_mask_ok(attn_mask, B, Hq, T, S):
            return "cudnn"
        causal_square = (not is_causal) or T == S
        if b.flash_sdp_enabled() and attn_mask is None and D == Dv and D <= 256 and causal_square:
            return "flash"
    align = 8 if low else 4
    aligned = all(t.storage_offset() % align == 0 for t in (q, k, v))
    if b.mem_efficient_sdp_enabled() and not gqa and dims_ok(align) and aligned:
        return "efficient"
    return "math"


def _cudnn_mask_ok(m, B, H, T, S):
    """check_attn_mask_shape (sdp_utils_cpp.h, PyTorch 2.11), which only cuDNN applies: no
    mask that needs grad (a learned bias: the memory-efficient kernel takes it), and a 2-d
    [T or 1, S or 1] or 4-d [B or 1, H or 1, T or 1, S or 1] one."""
    if m is None:
        return True
    if m.requires_grad or m.shape[-2] not in (T, 1) or m.shape[-1] not in (S, 1):
        return False
    return m.dim() == 2 or (m.dim() == 4 and m.shape[0] in (1, B) and m.shape[1] in (1, H))


def make_sdpa(orig, rec, row, is_fake):
    import torch

    aten = torch.ops.aten

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if not (is_fake(query) and query.device.type == "cuda"):
            return orig(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if torch.is_autocast_enabled("cuda"):
            # autocast lists SDPA as lower precision: it casts the floating arguments
            # (in the compiled wrapper's order: the last argument first) before PyTorch
            # picks a backend; this wrapper runs above autocast, so it casts them itself.
            dt = torch.get_autocast_dtype("cuda")
            cast = lambda t: t.to(dt) if t is not None and t.is_floating_point() and t.dtype != dt else t
            attn_mask = cast(attn_mask)
            value = cast(value)
            key = cast(key)
            query = cast(query)
        which = choose(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, row)
        rec.sdpa_choices[which] = rec.sdpa_choices.get(which, 0) + 1
        # PyTorch 2.11's convert_boolean_attn_mask: where(mask, 0.0, scalar -inf), no
        # logical_not (BERT's padded batch: 4 + 4 bytes and the float mask, the two
        # scalars freed later-first, in the real snapshot)
        attn_mask = _float_mask(attn_mask, query.dtype)
        if which == "math":
            with torch.autocast("cuda", enabled=False):
                return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        need_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value))
        if which == "cudnn":
            out = aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, need_grad, dropout_p, is_causal, False, scale=scale)
            if query.shape[-2] > 1:
                rec.hidden_temp(row.get("cudnn_attention_fwd_workspace", 0))
            else:
                rec.hidden_temp(cudnn_decode_workspace(
                    query.shape[0], query.shape[1], key.shape[1], key.shape[-2],
                    value.shape[-1]))
            return out[0]
        if which == "flash":
            out = aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)
            return out[0]
        if attn_mask is not None:
            attn_mask = _preprocess_mask(attn_mask, query, key)
        out = aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, need_grad, dropout_p, is_causal, scale=scale)
        return out[0]

    scaled_dot_product_attention.__doc__ = orig.__doc__
    return scaled_dot_product_attention


def _preprocess_mask(mask, query, key):
    """preprocess_mask (PyTorch 2.11's attention.cpp) before the memory-efficient kernel: a
    mask with a stride other than the last not a multiple of 8 elements (or a last stride
    not 1) is padded to the next multiple of 8 in its last dim by at::pad, a new block that
    autograd saves with the kernel's inputs, and sliced back; then it is expanded to
    [B, H, T, S] (device run 37: nn.Transformer's [B x H, 63, 63] decoder mask, one 63 x 64
    float copy per self-attention, kept for the backward)."""
    import torch

    if not (all(st % 8 == 0 for st in mask.stride()[:-1]) and mask.stride(-1) == 1):
        n = mask.size(-1)
        mask = torch.nn.functional.pad(mask, (0, 8 - n % 8))[..., :n]
    return mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))


def _float_mask(mask, dtype):
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, 0.0, torch.scalar_tensor(-math.inf, dtype=dtype, device=mask.device))


def _math(query_, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """`_scaled_dot_product_attention_math` for tensors that are not subclasses, op for op
    (autocast is off here, as below its dispatch key)."""
    import torch

    low = (torch.float16, torch.bfloat16)
    keep = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    acc = lambda t: t.to(torch.float32) if not keep and t.dtype in low else t
    origin = query_.dtype
    q_acc, k_acc, v_acc = acc(query_), acc(key), acc(value)
    negative = scale is not None and scale < 0.0
    s = abs(scale) if negative else scale
    factor = math.sqrt(s if s is not None else 1.0 / math.sqrt(q_acc.size(-1)))
    query = q_acc * (0.0 - factor if negative else factor)
    if is_causal:
        L, S = query.size(-2), k_acc.size(-2)
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        attn_mask = _float_mask(attn_mask, query.dtype)
    k_exp, v_exp = k_acc, v_acc
    if enable_gqa and query.size(-3) != k_acc.size(-3):
        k_exp = k_acc.repeat_interleave(query.size(-3) // k_acc.size(-3), -3)
        v_exp = v_acc.repeat_interleave(query.size(-3) // v_acc.size(-3), -3)
    attn = torch.matmul(query, k_exp.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.dropout(attn, dropout_p, True)
    # The C++ returns (matmul(attn, v).to(origin), attn.to(origin)): the compiler evaluates
    # the second first; its locals go in reverse order of declaration, then the tuple.
    weights = attn.to(origin)
    out = torch.matmul(attn, v_exp).to(origin)
    del attn, k_exp, v_exp, query, attn_mask, v_acc, k_acc, q_acc
    del weights
    return out
