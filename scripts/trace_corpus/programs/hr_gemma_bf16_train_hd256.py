"""Written for device run 28: transformers' Gemma (head dim 256, one KV head, tied
embeddings, a 32k vocabulary) in bf16 weights trained 3 steps with plain AdamW (foreach) and
gradient accumulation of 2 micro-batches, with a padded attention mask on the second."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=320)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GemmaConfig(hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                               vocab_size=32000, pad_token_id=0)
model = transformers.GemmaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    for micro in range(2):
        ids = torch.randint(1, cfg.vocab_size, (args.batch, args.seq), device=device)
        mask = torch.ones_like(ids)
        if micro:
            mask[:, -args.seq // 3:] = 0
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss / 2
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
