"""transformers LlamaForCausalLM (small, GQA) in bf16: model.generate() greedy with KV cache, 32 new tokens."""
import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--new", type=int, default=32)
args = p.parse_args()

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
model = LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
model.eval()

input_ids = torch.randint(3, config.vocab_size, (args.batch, args.prompt), device=device)
attention_mask = torch.ones_like(input_ids)
with torch.no_grad():
    for rep in range(2):
        out = model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=args.new,
            min_new_tokens=args.new, do_sample=False, use_cache=True, pad_token_id=0,
        )
if device == "cuda":
    torch.cuda.synchronize()
