"""Written for device run 40: a text CNN. Embeddings [batch, tokens, 300] transposed to
[batch, 300, tokens] (not contiguous) into three Conv1d widths (3, 4, 5) with ReLU and max over
time, concatenated, dropout and a linear head; Adam (foreach), batch 64 x 400 tokens, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class TextCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30000, 300)
        self.convs = nn.ModuleList(nn.Conv1d(300, 256, k) for k in (3, 4, 5))
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(3 * 256, 4)

    def forward(self, ids):
        x = self.emb(ids).transpose(1, 2)
        h = torch.cat([F.relu(c(x)).amax(dim=2) for c in self.convs], dim=1)
        return self.head(self.drop(h))


model = TextCNN().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    ids = torch.randint(0, 30000, (64, 400), device=device)
    y = torch.randint(0, 4, (64,), device=device)
    loss = F.cross_entropy(model(ids), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
