"""PyTorch's SDPA alone at the shapes of crates/vramroom-cuda/examples/attention_bench.rs.

    python3 scripts/torch_sdpa_bench.py OUT.jsonl [--reps N]

Writes one JSON line per (case, dtype): {"case", "dtype", "ms", "backend"}, ms the median of
N calls (CUDA events, after 3 warm-up calls), with the inputs laid out as transformers hands
them to F.scaled_dot_product_attention (GPT-2: views of the fused c_attn output; Llama: a
contiguous cache, enable_gqa when query heads outnumber key heads). attention_bench --torch
reads the file and prints the ratio beside its own figures.
"""
import json
import sys

import torch
import torch.nn.functional as F

# name, B, HQ, HKV, TQ, S, D, causal, fused  (same table as attention_bench.rs)
CASES = [
    ("gpt2 8x512", 8, 12, 12, 512, 512, 64, True, True),
    ("gpt2 32x1024", 32, 12, 12, 1024, 1024, 64, True, True),
    ("gpt2 decode 32x1024", 32, 12, 12, 1, 1024, 64, False, False),
    ("llama 4x1024", 4, 32, 8, 1024, 1024, 128, True, False),
    ("llama decode 8x2048", 8, 32, 8, 1, 2048, 128, False, False),
]


def backend_name(q, k, v, causal, gqa):
    """Which fused kernel PyTorch picks, by elimination (empty when none can be forced)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        try:
            with sdpa_kernel([b]):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            return b.name.lower()
        except RuntimeError:
            continue
    return ""


def main():
    out = sys.argv[1]
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 20
    dev = torch.device("cuda")
    rows = []
    for name, b, hq, hkv, tq, s, d, causal, fused in CASES:
        for dtype, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            if dtype == torch.float32 and hq != hkv:
                continue
            if fused:
                e = hq * d
                qkv = torch.randn(b, tq, 3 * e, device=dev, dtype=dtype)
                qs, ks, vs = qkv.split(e, dim=2)
                q, k, v = (t.view(b, tq, hq, d).transpose(1, 2) for t in (qs, ks, vs))
            else:
                q = torch.randn(b, hq, tq, d, device=dev, dtype=dtype)
                k = torch.randn(b, hkv, s, d, device=dev, dtype=dtype)
                v = torch.randn(b, hkv, s, d, device=dev, dtype=dtype)
            gqa = hq != hkv
            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            with torch.no_grad():
                for _ in range(3):
                    call()
                times = []
                for _ in range(reps):
                    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    call()
                    z.record()
                    z.synchronize()
                    times.append(a.elapsed_time(z))
                backend = backend_name(q, k, v, causal, gqa)
            times.sort()
            row = {"case": name, "dtype": dname, "ms": times[len(times) // 2], "backend": backend}
            rows.append(row)
            print("%-22s %-5s %8.3f ms  (%s)" % (name, dname, row["ms"], backend))
            del q, k, v
            torch.cuda.empty_cache()
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
