"""Written for device run 46, traced before it ran (blind): a wide-and-deep click model,
eight categorical features each through its own nn.Embedding (10^3 to 10^6 rows, dim 32),
13 dense features, a wide linear part over hashed crosses (nn.EmbeddingBag, sum), a deep
MLP, BCEWithLogits, Adagrad; batch 4096, 4 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
CARD = [1000, 5000, 20000, 100000, 300000, 1000000, 50, 7]


class WideDeep(nn.Module):
    def __init__(self):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(c, 32) for c in CARD)
        self.wide = nn.EmbeddingBag(1 << 18, 1, mode="sum")
        self.deep = nn.Sequential(nn.Linear(32 * len(CARD) + 13, 512), nn.ReLU(),
                                  nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, cat, dense, crosses):
        e = torch.cat([emb(cat[:, i]) for i, emb in enumerate(self.embs)] + [dense], 1)
        return self.deep(e) + self.wide(crosses)


model = WideDeep().to(device)
opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
for step in range(4):
    cat = torch.stack([torch.randint(0, c, (4096,), device=device) for c in CARD], 1)
    dense = torch.randn(4096, 13, device=device)
    crosses = torch.randint(0, 1 << 18, (4096, 6), device=device)
    y = torch.randint(0, 2, (4096, 1), device=device).float()
    loss = F.binary_cross_entropy_with_logits(model(cat, dense, crosses), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
