"""Written for device run 47, traced before it ran (blind): a graph convolution over a
fixed ring-lattice graph built on the GPU from aranges (each of 100,000 nodes linked to the
next 8): the edge list's unique sources with counts (torch.unique), node degrees by
bincount, a batch vector by repeat_interleave, symmetric normalisation and index_add_
message passing, two layers of width 256, Adam, 4 steps."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
N, K, D, G = 100_000, 8, 256, 50
src = torch.arange(N, device=device).repeat_interleave(K)
dst = (src + torch.arange(1, K + 1, device=device).repeat(N)) % N
nodes, counts = torch.unique(src, return_counts=True)
deg = torch.bincount(dst, minlength=N).float().clamp(min=1)
norm = (deg[src] * deg[dst]).rsqrt().unsqueeze(1)
batch = torch.arange(G, device=device).repeat_interleave(torch.full((G,), N // G,
                                                                    device=device))
w1, w2 = nn.Linear(D, D).to(device), nn.Linear(D, D).to(device)
opt = torch.optim.Adam(list(w1.parameters()) + list(w2.parameters()), lr=1e-3)
for step in range(4):
    x = torch.randn(N, D, device=device)
    for w in (w1, w2):
        m = w(x)[src] * norm
        x = torch.zeros(N, D, device=device).index_add_(0, dst, m).relu()
    pooled = torch.zeros(G, D, device=device).index_add_(0, batch, x)
    loss = pooled.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss), int(counts.max()))
