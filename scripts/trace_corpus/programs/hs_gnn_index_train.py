"""Written for device run 26: a message-passing network by hand: node features gathered by
edge (h[src], whose backward is index_put_ with accumulate), messages summed with index_add_,
3 layers, AdamW, 50k nodes and 400k edges, fp32, 4 steps."""
import argparse
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--nodes", type=int, default=50_000)
p.add_argument("--edges", type=int, default=400_000)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

torch.manual_seed(0)


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.msg = nn.Linear(2 * d, d)
        self.upd = nn.Linear(2 * d, d)

    def forward(self, h, src, dst):
        m = torch.relu(self.msg(torch.cat([h[src], h[dst]], dim=-1)))
        agg = torch.zeros_like(h).index_add_(0, dst, m)
        return torch.relu(self.upd(torch.cat([h, agg], dim=-1)))


layers = nn.ModuleList([Layer(args.dim) for _ in range(3)]).to(device)
head = nn.Linear(args.dim, 10).to(device)
params = list(layers.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-3)
x = torch.randn(args.nodes, args.dim, device=device)
src = torch.randint(0, args.nodes, (args.edges,), device=device)
dst = torch.randint(0, args.nodes, (args.edges,), device=device)
y = torch.randint(0, 10, (args.nodes,), device=device)
for _ in range(args.steps):
    h = x
    for layer in layers:
        h = layer(h, src, dst)
    loss = nn.functional.cross_entropy(head(h), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
