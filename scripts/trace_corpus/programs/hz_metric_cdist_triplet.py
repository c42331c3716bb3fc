"""Written for device run 32: metric learning: an MLP embedder, F.normalize, pairwise
torch.cdist distances for batch-hard triplet mining (max/min over masked distances), the
triplet margin loss, SGD with momentum, fp32, batch 512, 4 steps; then retrieval under
no_grad: cdist of 2048 queries against 8192 keys and topk."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128)).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
for step in range(4):
    x = torch.randn(512, 256, device=device)
    labels = torch.randint(0, 32, (512,), device=device)
    e = F.normalize(net(x), dim=-1)
    d = torch.cdist(e, e)
    same = labels[:, None] == labels[None, :]
    hardest_pos = (d * same).max(dim=1).values
    hardest_neg = (d + 1e4 * same).min(dim=1).values
    loss = F.relu(hardest_pos - hardest_neg + 0.2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
with torch.no_grad():
    q = F.normalize(net(torch.randn(2048, 256, device=device)), dim=-1)
    k = F.normalize(net(torch.randn(8192, 256, device=device)), dim=-1)
    top = torch.cdist(q, k).topk(10, largest=False)
print(float(loss), top.indices.shape)
