"""Written for device run 37: nn.Transformer encoder-decoder (batch_first, training) with a
source padding mask, a causal target mask and a target padding mask, shared embeddings,
label-smoothed cross-entropy ignoring padding, Adam (foreach), fp32, batch 16, source 96 and
target 64 tokens, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, D, PAD = 6000, 256, 0
emb = nn.Embedding(V, D, padding_idx=PAD).to(device)
tr = nn.Transformer(D, 8, 3, 3, 1024, batch_first=True).to(device)
out = nn.Linear(D, V).to(device)
params = list(emb.parameters()) + list(tr.parameters()) + list(out.parameters())
opt = torch.optim.Adam(params, lr=1e-4)
causal = nn.Transformer.generate_square_subsequent_mask(63, device=device)
for step in range(3):
    src = torch.randint(1, V, (16, 96), device=device)
    src[:, 80:] = PAD
    tgt = torch.randint(1, V, (16, 64), device=device)
    tgt[:, 56:] = PAD
    h = tr(emb(src), emb(tgt[:, :-1]), tgt_mask=causal,
           src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt[:, :-1] == PAD,
           memory_key_padding_mask=src == PAD)
    loss = F.cross_entropy(out(h).reshape(-1, V), tgt[:, 1:].reshape(-1), ignore_index=PAD,
                           label_smoothing=0.1)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
