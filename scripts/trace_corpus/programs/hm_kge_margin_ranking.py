"""Written for device run 46, traced before it ran (blind): TransE knowledge-graph
embeddings, 200,000 entities and 500 relations of dim 200, one corrupted tail per triple,
L1 distances, nn.MarginRankingLoss, entity rows renormalised in place under no_grad each
step, Adam; batch 8192 triples, 4 steps."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
E, R, Dm, B = 200_000, 500, 200, 8192
ent = nn.Embedding(E, Dm).to(device)
rel = nn.Embedding(R, Dm).to(device)
crit = nn.MarginRankingLoss(margin=1.0)
opt = torch.optim.Adam(list(ent.parameters()) + list(rel.parameters()), lr=1e-3)
for step in range(4):
    h = torch.randint(0, E, (B,), device=device)
    r = torch.randint(0, R, (B,), device=device)
    t = torch.randint(0, E, (B,), device=device)
    t_neg = torch.randint(0, E, (B,), device=device)
    pos = (ent(h) + rel(r) - ent(t)).abs().sum(1)
    neg = (ent(h) + rel(r) - ent(t_neg)).abs().sum(1)
    loss = crit(neg, pos, torch.ones(B, device=device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        ent.weight.div_(ent.weight.norm(dim=1, keepdim=True).clamp_min(1.0))
print(float(loss))
