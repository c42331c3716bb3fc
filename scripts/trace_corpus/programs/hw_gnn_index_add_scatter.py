"""Written for device run 35: a message-passing network over a random graph (20,000 nodes,
200,000 edges): messages gathered with index_select, summed with index_add_, degrees by
index_add_ of ones, a max aggregation with scatter_reduce(amax), LayerNorm and ReLU, node
classification with cross-entropy, Adam (foreach), fp32, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
Nn, Ne, D, K = 20000, 200000, 128, 10


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.msg, self.upd = nn.Linear(D, D), nn.Linear(3 * D, D)
        self.norm = nn.LayerNorm(D)

    def forward(self, h, src, dst, deg):
        m = self.msg(h).index_select(0, src)
        s = torch.zeros_like(h).index_add_(0, dst, m) / deg[:, None]
        mx = torch.zeros_like(h).scatter_reduce(0, dst[:, None].expand(-1, D), m, "amax",
                                                include_self=False)
        return F.relu(self.norm(self.upd(torch.cat([h, s, mx], -1))))


layers = nn.ModuleList(Layer() for _ in range(3)).to(device)
head = nn.Linear(D, K).to(device)
opt = torch.optim.Adam(list(layers.parameters()) + list(head.parameters()), lr=1e-3)
for step in range(3):
    x = torch.randn(Nn, D, device=device)
    src = torch.randint(0, Nn, (Ne,), device=device)
    dst = torch.randint(0, Nn, (Ne,), device=device)
    deg = torch.zeros(Nn, device=device).index_add_(0, dst, torch.ones(Ne, device=device)).clamp(min=1)
    y = torch.randint(0, K, (Nn,), device=device)
    h = x
    for layer in layers:
        h = layer(h, src, dst, deg)
    loss = F.cross_entropy(head(h), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
