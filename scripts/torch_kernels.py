"""Per-kernel GPU time of transformers' forward of a fixtures/hf config (SDPA), from
PyTorch's profiler (CUPTI activity records: no replay, so it is quick beside
scripts/profile_hf.sh's Nsight Compute run), per forward, largest first.

    python3 scripts/torch_kernels.py NAME DTYPE BATCH SEQ [N]
"""
import collections
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

name, dtype, b, s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = int(sys.argv[5]) if len(sys.argv) > 5 else 3
cfg = AutoConfig.from_pretrained(f"fixtures/hf/{name}")
m = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="sdpa")
m = m.cuda().eval()
ids = torch.randint(0, cfg.vocab_size, (b, s), device="cuda")
with torch.no_grad():
    for _ in range(3):
        m(input_ids=ids, use_cache=False)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            m(input_ids=ids, use_cache=False)
        torch.cuda.synchronize()
tot = collections.defaultdict(lambda: [0.0, 0])
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        t = tot[e.name]
        t[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        t[1] += 1
all_us = sum(v[0] for v in tot.values()) / n
print(f"== {name} {dtype} {b}x{s}: transformers, per forward: {all_us:.1f} us of kernels, "
      f"{sum(v[1] for v in tot.values()) // n} launches")
for k, (us, c) in sorted(tot.items(), key=lambda kv: -kv[1][0]):
    print(f"  {us / n:10.1f} us {c // n:5d}  {k[:110]}")
