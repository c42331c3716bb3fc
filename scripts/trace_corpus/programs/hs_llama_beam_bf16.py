"""Written for device run 26: transformers' Llama (small, GQA) in bf16, beam search with
model.generate(num_beams=4): log-softmax over the vocabulary and topk over beams x vocabulary
each step, the KV cache reordered by beam, batch 4, 24 new tokens."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--prompt", type=int, default=256)
p.add_argument("--new", type=int, default=24)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, vocab_size=32000)
model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device=device)
with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=4,
                         max_new_tokens=args.new, min_new_tokens=args.new, early_stopping=False,
                         pad_token_id=0)
print(out.shape)
