"""Written for device run 27: transformers' Llama (small, GQA) in bf16 sampling with
model.generate(do_sample=True, top_k=40, top_p=0.95, temperature=0.8, repetition_penalty=1.2):
the penalty's gather and scatter over the vocabulary, the warpers' sort and cumsum, and
multinomial, batch 8, 32 new tokens."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--new", type=int, default=32)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, vocab_size=32000)
model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
ids = torch.randint(3, cfg.vocab_size, (args.batch, args.prompt), device=device)
with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=40,
                         top_p=0.95, temperature=0.8, repetition_penalty=1.2,
                         max_new_tokens=args.new, min_new_tokens=args.new, pad_token_id=0)
print(out.shape)
