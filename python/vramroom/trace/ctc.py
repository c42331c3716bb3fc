"""CTC loss (F.ctc_loss, nn.CTCLoss) on fake CUDA, as PyTorch 2.11's native CUDA kernels run it.

Design note. torch.ctc_loss is a C++ composite (LossCTC.cpp). For plain tensors it reads the
lengths on the host and runs ctc_loss_impl over them; for a tensor subclass, which a fake
tensor is, it takes another path whose ops (`_use_cudnn_ctc_loss.Tensor`, `_ctc_loss.Tensor`)
have no fake kernels. So while a trace runs, torch.ctc_loss is `ctc_loss` below, which does
what the plain-tensor path does on the GPU, and mode.py runs the two aten ops it reaches:

- cuDNN's CTC (`_use_cudnn_ctc_loss`: blank 0, 1-d int32 targets on the host, float32 log
  probs, every input length the full length, target lengths under 256 and within their
  input's) is not modelled: refused by name;
- `_ctc_loss` (`forward`, LossCTC.cu's ctc_loss_gpu_template), on the targets as int64 on
  the GPU (a copy unless they are): the target lengths, the input lengths and the targets'
  batch offsets as int64 [batch] tensors, then log_alpha [batch, T, 2 x max target + 1] and
  the loss [batch]; the input lengths, the target lengths, then the offsets freed. Without
  grad autograd keeps neither log_alpha nor the targets' copy;
- the reduction: "mean" makes the target lengths on the GPU and clamps them (the first
  freed), divides and means; "sum" sums;
- `_ctc_loss_backward` (`backward`): the three [batch] tensors again, log_beta like
  log_alpha, the gradient like the log probs (full of -inf); a large problem (the kernel's
  is_large) computes its blank terms through logsumexp on the way; then log_beta, the input
  lengths, the target lengths and the offsets freed.

The lengths are host values: Python ints, CPU tensors, or fake tensors whose values the
trace knows (values.py). Unknown target lengths of padded 2-d targets are presumed to reach
the padded width (log_alpha's size depends on the longest; a warning says so); of 1-d
concatenated targets they are refused by name. Checked against device run 41's
hp_crnn_ctc: the sizes and the order (its snapshot's addresses give the free order)."""

import torch

from .capture import UnsupportedOp
from .refuse import on_fake_cuda

PRESUMED = ("CTC target lengths of fake data presumed to reach the targets' padded width "
            "(log_alpha is sized by the longest)")
_orig = None


def _ints(x, vals):
    """x's values as Python ints, or None when the trace does not know them."""
    if isinstance(x, (list, tuple)):
        return [int(v) for v in x]
    if isinstance(x, int):
        return [x]
    r = vals._real(x)
    if r is None:
        return None
    with vals.host():
        return [int(v) for v in r.reshape(-1).tolist()]


def _uses_cudnn(lp, targets, il, tl, blank):
    """LossCTC.cpp's _use_cudnn_ctc_loss (the IntArrayRef one the plain path asks); None
    when it turns on lengths the trace does not know."""
    if not (torch.backends.cudnn.enabled and blank == 0 and targets.dim() == 1 and
            lp.dtype == torch.float32 and targets.dtype == torch.int32 and
            targets.device.type == "cpu" and targets.is_contiguous() and lp.dim() == 3):
        return False
    if il is None or tl is None:
        return None
    return all(i == lp.shape[0] for i in il) and \
        all(t < 256 and t <= i for t, i in zip(tl, il))


def make(vals, warn):
    """torch.ctc_loss for the trace: the plain-tensor path on fake CUDA log probs, the
    original elsewhere."""

    def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1,
                 zero_infinity=False):
        if not on_fake_cuda((log_probs,), {}):
            return _orig(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                         zero_infinity)
        op = torch.ops.aten._ctc_loss.default
        batched = log_probs.dim() == 3
        lp = log_probs if batched else log_probs.unsqueeze(1)
        il, tl = _ints(input_lengths, vals), _ints(target_lengths, vals)
        cudnn = _uses_cudnn(lp, targets, il, tl, blank)
        if cudnn is not False:
            raise UnsupportedOp(torch.ops.aten._cudnn_ctc_loss.default,
                                "cuDNN's CTC loss (blank 0, int32 targets on the host, float32 "
                                "log probs) is not modelled; int64 targets take PyTorch's own "
                                "kernels, which are")
        if tl is None:
            if targets.dim() != 2:
                raise UnsupportedOp(op, "the target lengths of concatenated (1-d) targets are "
                                        "fake data: their sum and longest are not known")
            warn(PRESUMED)
            tl = [int(targets.shape[1])] * int(lp.shape[1])
        if il is None:  # only checked on the GPU, not used for sizes
            il = [int(lp.shape[0])] * int(lp.shape[1])
        res = op(lp, targets.to(lp.device, torch.long), il, tl, blank, zero_infinity)[0]
        if zero_infinity:
            res = torch.where(res == float("inf"), torch.zeros((), dtype=res.dtype,
                                                               device=res.device), res)
        if reduction == 1:
            t = torch.tensor(tl, dtype=res.dtype, device=res.device).clamp_min(1)
            return (res / t).mean()
        if reduction == 2:
            return res.sum()
        return res if batched else res.squeeze(0)

    return ctc_loss


def install(vals, warn):
    global _orig
    if _orig is None:
        _orig = torch.ctc_loss
        torch.ctc_loss = make(vals, warn)


def uninstall():
    global _orig
    if _orig is not None:
        torch.ctc_loss = _orig
        _orig = None


def _lengths_tensors(targets, batch):
    """ctc_loss_gpu_template's target lengths, input lengths and the targets' batch offsets
    on the GPU, in that order."""
    return [targets.new_empty(batch, dtype=torch.long) for _ in range(3)]


def forward(row, rec, args, kwargs):
    """aten._ctc_loss (LossCTC.cu's ctc_loss_gpu_template)."""
    from .hidden import _bind

    b = _bind(torch.ops.aten._ctc_loss.default, args, kwargs)
    lp, tg, tl = b["log_probs"], b["targets"], list(b["target_lengths"])
    B = int(lp.shape[1])
    longest = max(tl) if tl else 0
    with torch.no_grad():
        tl_t, il_t, offs = _lengths_tensors(tg, B)
        log_alpha = lp.new_empty((B, lp.shape[0], 2 * longest + 1))
        nll = lp.new_empty((B,))
        del il_t, tl_t, offs  # destroyed in reverse order of declaration
    return nll, log_alpha


def backward(row, rec, args, kwargs):
    """aten._ctc_loss_backward (LossCTC.cu's ctc_loss_backward_gpu_template)."""
    from .hidden import _bind

    b = _bind(torch.ops.aten._ctc_loss_backward.default, args, kwargs)
    grad_out, lp, tg = b["grad"], b["log_probs"], b["targets"]
    nll, log_alpha, blank = b["neg_log_likelihood"], b["log_alpha"], int(b["blank"])
    T, B, C = (int(s) for s in lp.shape)
    with torch.no_grad():
        tl_t, il_t, offs = _lengths_tensors(tg, B)
        log_beta = torch.empty_like(log_alpha, memory_format=torch.contiguous_format)
        grad = torch.full_like(lp, float("-inf"), memory_format=torch.contiguous_format)
        if 2 * T + (24 * B) // 10 + (2 * C) // 10 > 450:  # is_large
            torch.exp(lp, out=grad)
            s = (log_alpha.shape[2] - 1) // 2 + 1
            la = log_alpha.as_strided((B, log_alpha.shape[1], s), (
                log_alpha.stride(0), log_alpha.stride(1), log_alpha.stride(2) * 2))
            lb = log_beta.as_strided((B, log_beta.shape[1], s), (
                log_beta.stride(0), log_beta.stride(1), log_beta.stride(2) * 2))
            grad.narrow(2, blank, 1).sub_(
                torch.logsumexp(la + lb, 2, True).permute(1, 0, 2)
                .add_(nll.view(1, B, 1)).sub_(lp.narrow(2, blank, 1)).exp_())
            grad.mul_(grad_out.view(1, B, 1))
            if b["zero_infinity"]:
                grad = torch.where(nll.view(1, B, 1) == float("inf"),
                                   torch.zeros((), dtype=grad.dtype, device=grad.device), grad)
        del log_beta, il_t, tl_t, offs
    return grad
