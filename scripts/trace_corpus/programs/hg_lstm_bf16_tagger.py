"""Written for device run 44, traced before it ran (blind): a sequence tagger in bfloat16
throughout (model.to(torch.bfloat16): RNNBase does not flatten bfloat16 weights, so cuDNN
copies them at every call), an nn.LSTM of 1024 over 256-wide inputs, sequence-first, a
linear head of 40 tags; SGD; batch 20 x 200 steps, two steps, then inference at batch 64."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
I, H, T, B, K = 256, 1024, 200, 20, 40

rnn = nn.LSTM(I, H).to(device, torch.bfloat16)
head = nn.Linear(H, K).to(device, torch.bfloat16)
params = list(rnn.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=1e-2)
x = torch.randn(T, B, I, device=device, dtype=torch.bfloat16)
tags = torch.randint(0, K, (T, B), device=device)
for step in range(2):
    y, _ = rnn(x)
    loss = nn.functional.cross_entropy(head(y).float().reshape(-1, K), tags.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    out, _ = rnn(torch.randn(T, 64, I, device=device, dtype=torch.bfloat16))
print(float(loss), out.shape)
