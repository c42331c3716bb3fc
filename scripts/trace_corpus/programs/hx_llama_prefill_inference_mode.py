"""Written for device run 24: transformers' Llama (small, GQA) in bf16, a batch of 8 x 1024
prompts run once under torch.inference_mode() with the KV cache kept, then 8 greedy decode
steps by hand (argmax, cat)."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--new", type=int, default=8)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=6,
                               num_attention_heads=8, num_key_value_heads=2, vocab_size=32000)
model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
with torch.inference_mode():
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    out = model(input_ids=ids, use_cache=True)
    cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(args.new):
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
