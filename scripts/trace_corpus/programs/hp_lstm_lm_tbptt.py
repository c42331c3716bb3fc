"""Written for device run 41: a word-level LSTM language model trained with truncated BPTT, as
PyTorch's word_language_model example does it. Embedding 10,000 x 256, a 2-layer nn.LSTM of
512 (dropout 0.2, sequence-first), a linear decoder; batch 32 by 70 steps; the hidden state
carried from batch to batch and detached; SGD with clip_grad_norm_; then an eval pass."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, E, H, B, T = 10000, 256, 512, 32, 70


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, H, 2, dropout=0.2)
        self.dec = nn.Linear(H, V)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.emb(x)), hidden)
        return self.dec(self.drop(out)).view(-1, V), hidden


model = LM().to(device)
opt = torch.optim.SGD(model.parameters(), lr=20.0)
crit = nn.CrossEntropyLoss()
data = torch.randint(0, V, (T * 6 + 1, B), device=device)
hidden = (torch.zeros(2, B, H, device=device), torch.zeros(2, B, H, device=device))
model.train()
for i in range(0, T * 6, T):
    x, y = data[i:i + T], data[i + 1:i + 1 + T].reshape(-1)
    hidden = tuple(h.detach() for h in hidden)
    opt.zero_grad()
    out, hidden = model(x, hidden)
    loss = crit(out, y)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
model.eval()
total = 0.0
with torch.no_grad():
    hidden = (torch.zeros(2, 10, H, device=device), torch.zeros(2, 10, H, device=device))
    for i in range(0, T * 2, T):
        out, hidden = model(data[i:i + T, :10], hidden)
        total += crit(out, data[i + 1:i + 1 + T, :10].reshape(-1)).item()
print(total)
