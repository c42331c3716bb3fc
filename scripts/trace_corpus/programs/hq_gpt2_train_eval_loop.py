"""Written for device run 28: transformers' GPT-2 (4 layers) trained with AdamW and a linear
warmup schedule, grads zeroed in place (zero_grad(set_to_none=False)), an eval pass under
torch.no_grad after every second step, batch 8 x 256, 4 steps."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=512)
model = transformers.GPT2LMHeadModel(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))
evals = []
for step in range(args.steps):
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=False)
    if step % 2 == 1:
        model.eval()
        with torch.no_grad():
            ev = torch.randint(0, cfg.vocab_size, (args.batch * 2, args.seq), device=device)
            evals.append(model(input_ids=ev, labels=ev).loss.item())
print(float(loss), evals)
