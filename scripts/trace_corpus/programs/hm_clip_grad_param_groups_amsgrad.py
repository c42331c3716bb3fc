"""Written for device run 46, traced before it ran (blind): an MLP mixer over 16 x 16 patch
tokens with three parameter groups (AdamW amsgrad foreach: its max_exp_avg_sq state),
clip_grad_norm_ with norm_type inf, then clip_grad_value_, a OneCycle schedule, fp32;
batch 128 of 3 x 64 x 64, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class Mixer(nn.Module):
    def __init__(self, d=256, tokens=16, depth=4):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 16, 16)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict(dict(
                n1=nn.LayerNorm(d), tok=nn.Sequential(nn.Linear(tokens, 64), nn.GELU(),
                                                      nn.Linear(64, tokens)),
                n2=nn.LayerNorm(d), ch=nn.Sequential(nn.Linear(d, 1024), nn.GELU(),
                                                     nn.Linear(1024, d)))))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for b in self.blocks:
            x = x + b["tok"](b["n1"](x).transpose(1, 2)).transpose(1, 2)
            x = x + b["ch"](b["n2"](x))
        return self.head(x.mean(1))


model = Mixer().to(device)
groups = [{"params": model.patch.parameters(), "lr": 1e-3},
          {"params": model.blocks.parameters(), "weight_decay": 0.05},
          {"params": model.head.parameters(), "lr": 3e-3}]
opt = torch.optim.AdamW(groups, lr=2e-3, amsgrad=True, foreach=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[1e-3, 2e-3, 3e-3], total_steps=10)
for step in range(3):
    x = torch.randn(128, 3, 64, 64, device=device)
    y = torch.randint(0, 10, (128,), device=device)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=float("inf"))
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
    opt.step()
    sched.step()
print(float(loss))
