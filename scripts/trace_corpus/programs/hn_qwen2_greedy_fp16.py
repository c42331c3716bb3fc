"""Written for device run 27: transformers' Qwen2 (small config: biased q/k/v, GQA, tied
embeddings) in fp16, greedy model.generate over a left-padded batch of 4, 40 new tokens."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--prompt", type=int, default=200)
p.add_argument("--new", type=int, default=40)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.Qwen2Config(hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, vocab_size=50000,
                               tie_word_embeddings=True)
model = transformers.Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.float16).eval()
ids = torch.randint(3, cfg.vocab_size, (args.batch, args.prompt), device=device)
mask = torch.ones_like(ids)
mask[1:, :20] = 0  # left padding
with torch.no_grad():
    out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new,
                         min_new_tokens=args.new, pad_token_id=0)
print(out.shape)
