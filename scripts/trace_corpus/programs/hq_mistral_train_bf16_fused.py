"""Written for device run 28: transformers' Mistral (small, GQA) with bf16 weights trained
with fused AdamW, a cosine LR schedule and gradient clipping, 3 steps of batch 4 x 384, a
padded attention mask on half the batch."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=384)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.MistralConfig(hidden_size=512, intermediate_size=1792, num_hidden_layers=4,
                                 num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                                 sliding_window=None)
model = transformers.MistralForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
for step in range(args.steps):
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    mask = torch.ones_like(ids)
    mask[: args.batch // 2, -args.seq // 4:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
