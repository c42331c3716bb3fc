"""Written for device run 29: a hand-written decoder-only LM on nn.TransformerDecoderLayer
blocks' self-attention (nn.TransformerEncoder with a causal mask, batch_first, norm_first,
GELU), learned positions, a head tied to the embedding, AdamW(foreach=False) (the
single-tensor loop), OneCycleLR, fp32, batch 12 x 256, 3 steps."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, D, L, T, B = 16000, 512, 4, 256, 12


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(1, T, D))
        layer = nn.TransformerEncoderLayer(D, 8, 4 * D, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        h = self.tok(ids) + self.pos[:, : ids.shape[1]]
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


model = LM().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=3)
for step in range(3):
    ids = torch.randint(0, V, (B, T + 1), device=device)
    logits = model(ids[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
print(float(loss))
