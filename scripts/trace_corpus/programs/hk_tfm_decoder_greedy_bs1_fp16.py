"""Written for device run 45, traced before it ran (blind): an nn.TransformerDecoder (4
layers, d_model 512, batch_first, causal mask) over an nn.TransformerEncoder's memory, cast
to fp16, greedy decoding of one sequence at a time that re-runs the whole prefix each step
(no KV cache), under inference_mode: 2 sources x 48 new tokens."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, D = 8000, 512
emb = nn.Embedding(V, D)
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 8, 2048, batch_first=True), 4)
dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, 8, 2048, batch_first=True), 4)
out = nn.Linear(D, V)
mods = nn.ModuleList([emb, enc, dec, out]).to(device, torch.float16).eval()
results = []
with torch.inference_mode():
    for s in range(2):
        src = torch.randint(0, V, (1, 96), device=device)
        memory = enc(emb(src))
        ys = torch.zeros(1, 1, dtype=torch.long, device=device)
        for t in range(48):
            mask = nn.Transformer.generate_square_subsequent_mask(ys.size(1), device=device,
                                                                 dtype=torch.float16)
            h = dec(emb(ys), memory, tgt_mask=mask)
            nxt = out(h[:, -1]).argmax(-1, keepdim=True)
            ys = torch.cat([ys, nxt], dim=1)
        results.append(ys)
print(torch.cat(results).shape)
