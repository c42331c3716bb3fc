"""Written for device run 39: one MLP (four 1024-wide Linear layers, batch 256) trained two
steps with each of RMSprop (momentum), Adagrad, NAdam, RAdam, Adamax, SGD (Nesterov, weight
decay) and RMSprop with foreach=False; each optimizer is dropped before the next, so its state
is freed."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                    nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
makers = [
    lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9),
    lambda p: torch.optim.Adagrad(p, lr=1e-2),
    lambda p: torch.optim.NAdam(p, lr=1e-3),
    lambda p: torch.optim.RAdam(p, lr=1e-3),
    lambda p: torch.optim.Adamax(p, lr=1e-3),
    lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda p: torch.optim.RMSprop(p, lr=1e-3, foreach=False),
]
for make in makers:
    opt = make(net.parameters())
    for step in range(2):
        x = torch.randn(256, 512, device=device)
        y = torch.randint(0, 10, (256,), device=device)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    del opt
print(float(loss))
