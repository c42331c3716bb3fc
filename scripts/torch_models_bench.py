"""PyTorch's side of `vramroom bench models`: the same cases, measured the same way.

    python3 scripts/torch_models_bench.py OUT.jsonl [--quick] [--iters N] [--warmup N] [--case S]...

Cases (names shared with crates/vramroom-tensor/src/bench.rs):
  resnet50 {fp32,bf16} bs{1,8,32,128} {infer,infer+graph}   torchvision ResNet-50, eval, no_grad
  resnet50 fp32 bs32 train                                    SGD momentum 0.9, cross-entropy
  gpt2 {fp32,bf16} {1x128,8x512,32x1024} {infer,infer+graph}  GPT-2 124M written like Vramroom's
                                                              (HF layout, eager attention)
  gpt2 ... infer (sdpa)                                       the same model with
                                                              F.scaled_dot_product_attention,
                                                              for reference
Per case: build the model, empty the cache and reset the peaks, warm up, then time each
iteration between two CUDA events and take the median. Peak = max_memory_allocated /
max_memory_reserved over the case (weights, input, activations, workspaces). PyTorch's
defaults throughout (cudnn.benchmark off, TF32 for cuDNN convolutions on, for matmul off).
"""
import json
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/torch_models.jsonl"
QUICK = "--quick" in sys.argv


def arg(name, default):
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


ITERS = arg("--iters", 30)
WARMUP = arg("--warmup", 5)
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Conv1D(nn.Module):
    """HF's Conv1D: a linear layer with the weight stored [in, out]."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, d, h, ctx, sdpa):
        super().__init__()
        self.h, self.sdpa = h, sdpa
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)
        self.register_buffer("bias", torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).permute(0, 2, 1, 3) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = q @ k.transpose(-1, -2)
            w = w / math.sqrt(d // self.h)
            w = w.masked_fill(self.bias[:t, :t], torch.finfo(w.dtype).min)
            w = w.softmax(-1)
            y = w @ v
        return self.c_proj(y.permute(0, 2, 1, 3).contiguous().reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, h, ctx, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, h, ctx, sdpa)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, sdpa=False, vocab=50257, ctx=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads, ctx, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device).view(1, t)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def cases():
    v = []
    if QUICK:
        return [("resnet50", "fp32", 1, 224, "infer"), ("resnet50", "fp32", 1, 224, "infer+graph"),
                ("resnet50", "fp32", 32, 224, "train"), ("gpt2", "fp32", 1, 128, "infer")]
    for dt in ("fp32", "bf16"):
        for bs in (1, 8, 32, 128):
            v += [("resnet50", dt, bs, 224, "infer"), ("resnet50", dt, bs, 224, "infer+graph")]
    v.append(("resnet50", "fp32", 32, 224, "train"))
    for dt in ("fp32", "bf16"):
        for bs, seq in ((1, 128), (8, 512), (32, 1024)):
            v += [("gpt2", dt, bs, seq, "infer"), ("gpt2", dt, bs, seq, "infer+graph"),
                  ("gpt2", dt, bs, seq, "infer (sdpa)")]
    return v


FILTERS = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--case"]


def name(model, dt, bs, seq, mode):
    return f"resnet50 {dt} bs{bs} {mode}" if model == "resnet50" else f"gpt2 {dt} {bs}x{seq} {mode}"


def run(model, dt, bs, seq, mode):
    import torchvision

    torch.manual_seed(0)
    dtype = DT[dt]
    if model == "resnet50":
        m = torchvision.models.resnet50().cuda().to(dtype)
        x = torch.randn(bs, 3, seq, seq, device="cuda", dtype=dtype)
    else:
        m = GPT2(sdpa=mode.endswith("(sdpa)")).cuda().to(dtype)
        x = (torch.arange(bs * seq, device="cuda") * 7919 % 50257).view(bs, seq)
    train = mode == "train"
    m.train(train)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) if train else None
    y = (torch.arange(bs, device="cuda") * 37 % 1000) if train else None

    def step():
        if train:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(m(x), y).backward()
            opt.step()
        else:
            with torch.no_grad():
                m(x)

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    times = []
    if mode == "infer+graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(max(WARMUP, 1)):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            out = m(x)
        for _ in range(max(WARMUP, 1)):
            g.replay()
        for _ in range(ITERS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        del out, g
    else:
        for _ in range(max(WARMUP, 1)):
            step()
        for _ in range(ITERS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    torch.cuda.synchronize()
    rec = dict(case=name(model, dt, bs, seq, mode), ms=statistics.median(times), ms_min=min(times),
               iters=ITERS, items_per_s=bs * 1000.0 / statistics.median(times),
               peak_allocated=torch.cuda.max_memory_allocated(),
               peak_reserved=torch.cuda.max_memory_reserved())
    del m, x, y, opt
    torch.cuda.empty_cache()
    return rec


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    with open(OUT, "w") as f:
        for c in cases():
            names = [name(*x) for x in cases()]
            if FILTERS and not any((name(*c) == f) if f in names else (f in name(*c))
                                   for f in FILTERS):
                continue
            try:
                rec = run(*c)
            except Exception as e:  # noqa: BLE001 - report and go on
                rec = dict(case=name(*c), error=repr(e))
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
