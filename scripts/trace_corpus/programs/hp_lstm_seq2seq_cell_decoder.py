"""Written for device run 41: a seq2seq model, an nn.LSTM encoder (batch_first, 2 layers of
256) and an nn.LSTMCell decoder stepped 30 times with teacher forcing and dot-product
attention over the encoder states; Adam; fp32; batch 48, source 40 tokens."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, E, H, B, S, T = 8000, 192, 256, 48, 40, 30


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb = nn.Embedding(V, E)
        self.tgt_emb = nn.Embedding(V, E)
        self.enc = nn.LSTM(E, H, num_layers=2, batch_first=True)
        self.cell = nn.LSTMCell(E + H, H)
        self.out = nn.Linear(2 * H, V)

    def forward(self, src, tgt):
        mem, (h, c) = self.enc(self.src_emb(src))
        h, c = h[-1], c[-1]
        ctx = torch.zeros(src.shape[0], H, device=src.device)
        logits = []
        for t in range(tgt.shape[1]):
            h, c = self.cell(torch.cat([self.tgt_emb(tgt[:, t]), ctx], -1), (h, c))
            att = torch.softmax(torch.bmm(mem, h.unsqueeze(2)).squeeze(2), -1)
            ctx = torch.bmm(att.unsqueeze(1), mem).squeeze(1)
            logits.append(self.out(torch.cat([h, ctx], -1)))
        return torch.stack(logits, 1)


model = Seq2Seq().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    src = torch.randint(0, V, (B, S), device=device)
    tgt = torch.randint(0, V, (B, T + 1), device=device)
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
