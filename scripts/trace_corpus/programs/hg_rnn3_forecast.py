"""Written for device run 44, traced before it ran (blind): a forecaster, an nn.RNN (tanh) of
three layers of 128 over 32 features, sequence-first, 300 steps, its last output into a
linear head; MSE, SGD with momentum; batch 64, four steps."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
F, H, T, B = 32, 128, 300, 64

rnn = nn.RNN(F, H, num_layers=3).to(device)
head = nn.Linear(H, 1).to(device)
opt = torch.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=1e-3, momentum=0.9)
x = torch.randn(T, B, F, device=device)
target = torch.randn(B, 1, device=device)
for step in range(4):
    y, _ = rnn(x)
    loss = nn.functional.mse_loss(head(y[-1]), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
