"""nn.MultiheadAttention's inference fast path, `aten._native_multi_head_attention`, as CUDA runs it.

Design note: in eval, with no grad and no autocast, a batch_first self-attention MHA
(torchvision's ViT, nn.TransformerEncoderLayer's attention) calls this one op. Its fake kernel
(torch/_meta_registrations.py) returns the output alone, so a trace saw none of what the CUDA
kernel allocates inside it: the [B, T, 3D] projection, the attention output and, on the math
branch, the packed q/k/v and the [B, H, T, T] scores, which at inference are the largest
transients of the step. attention.cu's `native_multi_head_attention_cuda` (PyTorch 2.11) is
re-run here op by op through the recording mode, so each part allocates and frees where the
kernel's do (every op below is one the CUDA code calls, in its order):

- SDPA branch: query, key and value the same tensor, need_weights False, no mask, and a
  fused backend (flash, efficient, cuDNN: sdpa.choose) for the query viewed as heads.
  linear to [B, T, 3D]; its thirds viewed as heads; scaled_dot_product_attention (the
  tracer's, which picks the backend again for those views); the output viewed back as
  [B, T, D] (a copy only where its layout needs one); the output projection. Then the C++
  locals die in reverse: the attention output, then the projection's [B, T, 3D].
- math branch, everything else: qkv_projection (one matmul for self-attention, else per-part
  matmuls and a cat); _transform_bias_rescale_qkv's packed [3, B, H, T, dh] and the projection
  freed; bmm scores [B, H, T, T]; softmax in place without a mask, else the mask made bool
  and masked_softmax's output (_masked_softmax below; the scores freed as it replaces them); bmm into q's storage;
  the scores freed unless need_weights; transform_0213's contiguous [B, T, D] copy, linear,
  the copy freed; with need_weights averaged, sum over heads (the scores freed) divided in
  place; the packed buffer freed last, as the function returns.

nn.TransformerEncoderLayer's fast path, `aten._transformer_encoder_layer_fwd` (no fake kernel at
all: refused before), is transformer.cpp's `transformer_encoder_layer_forward` the same way:
layer norms (norm_first or after), the attention above, the residual added in place, the
feed-forward as `_addmm_activation` (bias, GELU or ReLU fused) then `addmm`, the second
residual in place; each replaced tensor freed as the next one takes its name.

Derived from the source, not yet from a GPU's snapshot (device run 29's
hy_tv_vit_infer_bf16_fastpath and hy_mha_encoder_eval_fastpath record both branches).
"""


def native_mha(row, rec, args, kwargs):
    """(output, weights) of aten._native_multi_head_attention; run inside the recording mode."""
    import torch
    import torch.nn.functional as F

    from .hidden import _bind
    from .sdpa import choose

    aten = torch.ops.aten
    b = _bind(aten._native_multi_head_attention.default, args, kwargs)
    query, key, value = b["query"], b["key"], b["value"]
    D, H = int(b["embed_dim"]), int(b["num_head"])
    mask, need_weights = b.get("mask"), bool(b.get("need_weights", True))
    dh = D // H
    B = query.shape[0]
    if query is key and key is value and not need_weights:
        heads = lambda t: t.view(t.shape[0], -1, H, dh).transpose(1, 2)
        fused = choose(heads(query), heads(key), heads(value), mask, 0.0, False, False, row)
        if mask is None and fused in ("flash", "efficient", "cudnn"):
            x = aten.linear.default(query, b["qkv_weight"], b["qkv_bias"])
            q, k, v = (heads(c) for c in x.chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v)
            past = y.transpose(1, 2).reshape(B, -1, D)
            out = aten.linear.default(past, b["proj_weight"], b["proj_bias"])
            del past, y
            del q, k, v, x
            return out, query.new_empty(0)

    qkv = _qkv_projection(aten, query, key, value, D, b["qkv_weight"])
    if qkv.numel() == 0:
        return torch.empty_like(query), query.new_empty(0)
    T = qkv.shape[1]
    packed = torch.empty((3, B, H, T, dh), dtype=b["qkv_bias"].dtype, device=qkv.device)
    del qkv
    q, k, v = packed.view(3 * B, H, T, dh).split(B, 0)
    qkt = torch.bmm(q.reshape(B * H, T, dh), k.reshape(B * H, T, dh).transpose(2, 1))
    qkt = qkt.view(B, H, T, T)
    if mask is None:
        aten._softmax.out(qkt, 3, False, out=qkt)
    else:
        qkt = _masked_softmax(qkt, mask)
    torch.bmm(qkt.view(B * H, T, T), v.reshape(B * H, T, dh), out=q.reshape(B * H, T, dh))
    attn_ctx = q
    if not need_weights:
        qkt = None
    a0213 = attn_ctx.permute(0, 2, 1, 3).contiguous().view(B, T, D)
    proj = aten.linear.default(a0213.view(B * T, D), b["proj_weight"], b["proj_bias"])
    del a0213
    proj = proj.view(B, T, -1)
    if need_weights and b.get("average_attn_weights", True):
        qkt = qkt.sum(1)
        qkt.div_(H)
    del q, k, v, attn_ctx, packed
    return proj, (qkt if qkt is not None else query.new_empty(0))


def _masked_softmax(scores, mask):
    """attention.cpp's masked_softmax over [B, H, T, T] scores: the mask made bool (nn's
    canonical masks are floats: [B, T] for a key padding mask, the expanded [T, T] or a full
    sum otherwise, made contiguous by the copy), then SoftMax.cu's masked_softmax_cuda: its
    output; past 1024 keys (or 4096 bytes a row) or with a mask still not contiguous, the
    fallback softmax(masked_fill(scores, mask, -inf)) replaces it (the first output freed,
    then the filled scores). The bool copy dies as masked_softmax returns, then the scores
    the result replaces."""
    import torch

    as_bool = [mask if mask.dtype == torch.bool else mask.to(torch.bool)]
    m = as_bool[0]
    out = torch.empty_like(scores)
    T = scores.shape[-1]
    if T > 1024 or T * scores.element_size() > 4096 or not m.is_contiguous():
        if m.dim() == 2 and m.shape[0] == scores.shape[0] and m.shape[1] == T:
            m = m.view(m.shape[0], 1, 1, T)  # a key padding mask, broadcast over heads and rows
        filled = scores.masked_fill(m, float("-inf"))
        soft = torch.softmax(filled, -1)
        out = soft
        del soft, filled
    del m
    as_bool.clear()
    return out


def _qkv_projection(aten, query, key, value, D, w):
    """attention.cpp's qkv_projection: one gemm for self-attention, else per-part gemms and
    a cat (each part freed as the cat returns)."""
    import torch

    if key is value:
        if query is key:
            return aten.matmul.default(query, w.t())
        wq, wkv = w.split([D, 2 * D], 0)
        parts = [aten.matmul.default(query, wq.t()), aten.matmul.default(key, wkv.t())]
    else:
        wq, wk, wv = w.chunk(3, 0)
        parts = [aten.matmul.default(query, wq.t()), aten.matmul.default(key, wk.t()),
                 aten.matmul.default(value, wv.t())]
    out = torch.cat(parts, 2)
    del parts
    return out


def encoder_layer(row, rec, args, kwargs):
    """aten._transformer_encoder_layer_fwd; run inside the recording mode."""
    import torch

    from .hidden import _bind

    aten = torch.ops.aten
    b = _bind(aten._transformer_encoder_layer_fwd.default, args, kwargs)
    src = b["src"]
    if src.numel() == 0:
        return src.clone()
    D, eps, first = int(b["embed_dim"]), float(b["eps"]), bool(b["norm_first"])
    norm = lambda t, i: aten.layer_norm.default(
        t, [D], b["norm_weight_%d" % i], b["norm_bias_%d" % i], eps, True)
    x = norm(src, 1) if first else src
    x = native_mha(row, rec, (x, x, x, D, int(b["num_heads"]), b["qkv_weight"], b["qkv_bias"],
                              b["proj_weight"], b["proj_bias"], b.get("mask"), False, True,
                              b.get("mask_type")), {})[0]
    x.add_(src)
    if not first:
        x = norm(x, 1)
    pre = x
    if first:
        x = norm(x, 2)
    B, T = x.shape[0], x.shape[1]
    h = aten._addmm_activation.default(b["ffn_bias_1"], x.view(B * T, D), b["ffn_weight_1"].t(),
                                       use_gelu=bool(b["use_gelu"]))
    h2 = aten.addmm.default(b["ffn_bias_2"], h, b["ffn_weight_2"].t())
    del h
    x = h2.view(B, T, -1)
    del h2
    x.add_(pre)
    if not first:
        x = norm(x, 2)
    del pre
    return x
