"""Written for device run 45, traced before it ran (blind): a metric-learning embedder (MLP
over 512-d features into F.normalize'd 128-d embeddings), in-batch hardest negatives from
the cosine-similarity matrix (masked with the labels, argmax), TripletMarginWithDistanceLoss
with cosine distance, SGD with Nesterov momentum; batch 1024, 4 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(512, 1024), nn.BatchNorm1d(1024), nn.ReLU(),
                    nn.Linear(1024, 128)).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True)
crit = nn.TripletMarginWithDistanceLoss(
    distance_function=lambda a, b: 1 - F.cosine_similarity(a, b), margin=0.2)
for step in range(4):
    x = torch.randn(1024, 512, device=device)
    labels = torch.randint(0, 64, (1024,), device=device)
    e = F.normalize(net(x), dim=1)
    sim = e @ e.t()
    same = labels[:, None] == labels[None, :]
    pos = sim.masked_fill(~same | torch.eye(1024, dtype=torch.bool, device=device), -2).argmax(1)
    neg = sim.masked_fill(same, -2).argmax(1)
    loss = crit(e, e[pos], e[neg])
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
