"""Written for device run 44, traced before it ran (blind): a sentence classifier, a
bidirectional nn.GRU of 256 over 128-wide embeddings, mean-pooled into a linear head of 6
classes, trained under float16 autocast with a GradScaler and Adam; batch 48 x 120 tokens,
three steps."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, E, H, B, T, C = 20000, 128, 256, 48, 120, 6


class Cls(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.GRU(E, H, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * H, C)

    def forward(self, x):
        y, _ = self.rnn(self.emb(x))
        return self.head(y.mean(1))


model = Cls().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
x = torch.randint(0, V, (B, T), device=device)
y = torch.randint(0, C, (B,), device=device)
for step in range(3):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
print(float(loss))
