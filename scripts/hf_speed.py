"""Speed of Hugging Face models on the GPU: transformers (PyTorch SDPA) beside Vramroom's
`--model PATH` (its SDPA op on the CUDA backend), same configs, same shapes.

    python3 scripts/hf_speed.py VRAMROOM_BIN OUT.jsonl [--iters N] [--only gpt2|llama-small]

Cases: fixtures/hf/gpt2 forward (use_cache=False, eval, no_grad) in float32 and bfloat16 at
8x512 and 32x1024; fixtures/hf/llama-small forward at 8x512 and its decode step (batch 8,
prompt 512: (generate 33 new tokens - generate 1) / 32, greedy, as both sides run it).
PyTorch: median of CUDA-event timings after warm-up, random weights (from_config).
Vramroom: `vramroom loadtest --device cuda -n N -c 1` with the same flags, the median
request latency (a request is the input's creation, the forward and a synchronize).
"""
import json
import statistics
import subprocess
import sys
import tempfile

import torch
from transformers import AutoConfig, AutoModelForCausalLM

HR = sys.argv[1]
OUT = sys.argv[2]
ITERS = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 20
DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_ms(fn, iters=ITERS, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def load(name, dtype):
    cfg = AutoConfig.from_pretrained(f"fixtures/hf/{name}")
    m = AutoModelForCausalLM.from_config(cfg, dtype=DT[dtype], attn_implementation="sdpa")
    return m.cuda().eval(), cfg


def torch_forward(name, dtype, b, s):
    m, cfg = load(name, dtype)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device="cuda")
    with torch.no_grad():
        ms = torch_ms(lambda: m(input_ids=ids, use_cache=False))
    del m
    torch.cuda.empty_cache()
    return ms


def torch_generate(name, dtype, b, p, n):
    m, cfg = load(name, dtype)
    ids = torch.randint(0, cfg.vocab_size, (b, p), device="cuda")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ms = torch_ms(lambda: m.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                         do_sample=False), iters=max(5, ITERS // 4))
    del m
    torch.cuda.empty_cache()
    return ms


def vramroom_ms(args, n=ITERS + 3):
    with tempfile.TemporaryDirectory() as d:
        cmd = [HR, "loadtest", "--device", "cuda", "-n", str(n), "-c", "1", "--no-search", "--quiet",
               "--json", "--out", d] + args
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print("vramroom failed:", " ".join(cmd), r.stderr.strip()[-300:])
            return None
        return json.loads(r.stdout)["latency"]["p50_ms"]


ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""

rows = []
for dtype in ["float32", "bfloat16"]:
    for b, s in [(8, 512), (32, 1024)]:
        if ONLY not in ("", "gpt2"):
            continue
        rows.append((f"gpt2 {dtype} {b}x{s} forward", torch_forward("gpt2", dtype, b, s),
                     vramroom_ms(["--model", "fixtures/hf/gpt2", "--dtype", dtype, "--batch", str(b),
                                  "--seq", str(s), "--no-cache"])))
for dtype in ["float32", "bfloat16"] if ONLY in ("", "llama-small") else []:
    rows.append((f"llama-small {dtype} 8x512 forward", torch_forward("llama-small", dtype, 8, 512),
                 vramroom_ms(["--model", "fixtures/hf/llama-small", "--dtype", dtype, "--batch", "8",
                              "--seq", "512", "--no-cache"])))
    t1 = torch_generate("llama-small", dtype, 8, 512, 1)
    t33 = torch_generate("llama-small", dtype, 8, 512, 33)
    g = ["--model", "fixtures/hf/llama-small", "--dtype", dtype, "--batch", "8", "--mode", "generate",
         "--prompt", "512"]
    h1 = vramroom_ms(g + ["--new", "1"], n=8)
    h33 = vramroom_ms(g + ["--new", "33"], n=6)
    rows.append((f"llama-small {dtype} 8x512 decode step", (t33 - t1) / 32,
                 None if h1 is None or h33 is None else (h33 - h1) / 32))

print("Hugging Face models on the GPU: transformers (SDPA) vs Vramroom --model PATH (median ms)")
print(f"  {'case':40s} {'torch ms':>10s} {'hr ms':>10s} {'t/hr':>7s}")
with open(OUT, "w") as f:
    for name, t, h in rows:
        f.write(json.dumps({"case": name, "torch_ms": t, "vramroom_ms": h}) + "\n")
        ratio = f"{t / h:6.2f}x" if h else "   -"
        hs = f"{h:10.3f}" if h is not None else "         -"
        print(f"  {name:40s} {t:10.3f} {hs} {ratio}")
print("  t/hr above 1: Vramroom faster.")
