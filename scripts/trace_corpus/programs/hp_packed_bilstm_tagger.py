"""Written for device run 41: a sequence tagger over variable-length sentences,
pack_padded_sequence into a 2-layer bidirectional nn.LSTM (batch_first, 200 a direction),
pad_packed_sequence back, a linear layer to 17 tags and a cross-entropy that ignores the
padding; AdamW (fused); batch 32, lengths 5 to 60."""
import os

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
V, E, H, K, B = 12000, 100, 200, 17, 32


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E, padding_idx=0)
        self.lstm = nn.LSTM(E, H, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * H, K)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True,
                                      enforce_sorted=False)
        y, _ = self.lstm(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        return self.out(y)


model = Tagger().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
g = torch.Generator().manual_seed(1)
for step in range(4):
    lengths = torch.randint(5, 61, (B,), generator=g)
    T = int(lengths.max())
    x = torch.randint(1, V, (B, T), generator=g)
    x[torch.arange(T)[None, :] >= lengths[:, None]] = 0
    y = torch.randint(0, K, (B, T), generator=g)
    y[x == 0] = -100
    x, y = x.to(device), y.to(device)
    logits = model(x, lengths)
    loss = nn.functional.cross_entropy(logits.reshape(-1, K), y.reshape(-1), ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(float(loss))
