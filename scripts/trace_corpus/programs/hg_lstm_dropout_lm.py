"""Written for device run 44, traced before it ran (blind): a word-level language model, an
nn.LSTM of two layers of 512 with dropout 0.3 between them (batch_first) over 128-wide
embeddings of an 8,000-word vocabulary; cross-entropy, AdamW (foreach); batch 24 x 70 tokens,
three steps, then a validation pass under no_grad in eval mode."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, E, H, B, T = 8000, 128, 512, 24, 70


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, H, num_layers=2, dropout=0.3, batch_first=True)
        self.out = nn.Linear(H, V)

    def forward(self, x):
        y, _ = self.rnn(self.emb(x))
        return self.out(y)


model = LM().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, V, (B, T + 1), device=device)
for step in range(3):
    logits = model(data[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    val = nn.functional.cross_entropy(model(data[:, :-1]).reshape(-1, V), data[:, 1:].reshape(-1))
print(float(loss), float(val))
