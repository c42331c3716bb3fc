"""Written for device run 47, traced before it ran (blind): a masked-LM step that scores only
the masked positions: every 7th token of every sequence (a pattern from an arange, as a
deterministic masking schedule makes it) is selected with a bool mask, hidden[mask] goes
through the vocabulary head (30,522), cross-entropy on the selected labels; a 6-layer
nn.TransformerEncoder of width 512, batch 32 x 256, AdamW, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, D, B, T = 30522, 512, 32, 256
emb = nn.Embedding(V, D).to(device)
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 8, 2048, batch_first=True,
                                                       dropout=0.1), 6).to(device)
head = nn.Linear(D, V).to(device)
params = list(emb.parameters()) + list(enc.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-4)
pos = torch.arange(T, device=device)
for step in range(3):
    ids = torch.randint(0, V, (B, T), device=device)
    mask = ((pos + step) % 7 == 0).expand(B, T)
    labels = ids[mask]
    inp = ids.masked_fill(mask, 103)
    h = enc(emb(inp))
    logits = head(h[mask])
    loss = F.cross_entropy(logits, labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(float(loss))
