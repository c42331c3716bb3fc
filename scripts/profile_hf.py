"""transformers' forward of a fixtures/hf config, N times, for a kernel profile beside
Vramroom's (scripts/profile_hf.sh): random weights, eval, no_grad, use_cache=False.

    python3 scripts/profile_hf.py NAME DTYPE BATCH SEQ N
"""
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

name, dtype, b, s, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cfg = AutoConfig.from_pretrained(f"fixtures/hf/{name}")
m = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype), attn_implementation="sdpa")
m = m.cuda().eval()
ids = torch.randint(0, cfg.vocab_size, (b, s), device="cuda")
torch.cuda.synchronize()
with torch.no_grad():
    for _ in range(n):
        m(input_ids=ids, use_cache=False)
torch.cuda.synchronize()
