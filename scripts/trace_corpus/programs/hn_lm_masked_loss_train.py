"""Written for device run 27: a GPT-2 (4 layers) trained with a hand-written masked loss, as
many training loops do: per-token cross-entropy (reduction="none"), the prompt positions
masked out with a bool mask, the loss normalised by mask.sum(), under bf16 autocast, foreach
AdamW, 3 steps of batch 8 x 256."""
import argparse
import os

import torch
import torch.nn.functional as F
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=4)
model = transformers.GPT2LMHeadModel(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
for step in range(args.steps):
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    prompt = torch.full((args.batch, 1), args.seq // 4, device=device)
    keep = torch.arange(args.seq - 1, device=device)[None, :] >= prompt
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits[:, :-1]
    ce = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), ids[:, 1:].reshape(-1),
                         reduction="none").view(args.batch, args.seq - 1)
    loss = (ce * keep).sum() / keep.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
