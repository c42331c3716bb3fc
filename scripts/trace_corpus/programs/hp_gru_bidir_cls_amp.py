"""Written for device run 41: a text classifier with a 2-layer bidirectional nn.GRU
(batch_first, 256 a direction) over 128-dim embeddings, max-pooled over time, trained under
fp16 autocast with GradScaler and AdamW (foreach); batch 64 by 120 tokens."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, E, H, C, B, T = 20000, 128, 256, 5, 64, 120


class Cls(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E, padding_idx=0)
        self.gru = nn.GRU(E, H, num_layers=2, batch_first=True, bidirectional=True, dropout=0.1)
        self.head = nn.Sequential(nn.Linear(2 * H, H), nn.ReLU(), nn.Linear(H, C))

    def forward(self, x):
        out, _ = self.gru(self.emb(x))
        return self.head(out.max(dim=1).values)


model = Cls().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
for step in range(5):
    x = torch.randint(1, V, (B, T), device=device)
    y = torch.randint(0, C, (B,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
print(float(loss))
