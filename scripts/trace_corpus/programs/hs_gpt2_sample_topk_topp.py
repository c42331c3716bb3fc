"""Written for device run 26: transformers' GPT-2 (6 layers, random init) sampling with
model.generate(do_sample=True, top_k=50, top_p=0.9): the warpers' topk, sort over the vocabulary,
softmax, cumsum and multinomial, batch 8, 48 new tokens, fp32, no_grad."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--new", type=int, default=48)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=6)
model = transformers.GPT2LMHeadModel(cfg).to(device).eval()
ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device=device)
with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=50,
                         top_p=0.9, max_new_tokens=args.new, min_new_tokens=args.new,
                         pad_token_id=cfg.eos_token_id)
print(out.shape)
