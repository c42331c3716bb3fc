"""Written for device run 18: a graph-style message-passing layer stack (gather of neighbour
features, einsum mixing, scatter_add aggregation, cumsum positional term), trained with SGD."""
import argparse
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--nodes", type=int, default=20000)
p.add_argument("--deg", type=int, default=16)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
d = 128
W = nn.ParameterList(nn.Parameter(torch.randn(4, d, d, device=device) * 0.05) for _ in range(3))
opt = torch.optim.SGD(W.parameters(), lr=0.01)
for step in range(args.steps):
    x = torch.randn(args.nodes, d, device=device)
    nbr = torch.randint(0, args.nodes, (args.nodes, args.deg), device=device)
    for w in W:
        msg = x[nbr]                                  # gather: nodes x deg x d
        mixed = torch.einsum("ndk,hkj->ndj", msg, w[:1]).relu()
        agg = torch.zeros_like(x).index_add_(0, nbr[:, 0], mixed.mean(1))
        x = (x + agg + msg.cumsum(1)[:, -1] * 0.01).tanh()
    loss = x.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
