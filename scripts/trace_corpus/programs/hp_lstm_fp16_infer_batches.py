"""Written for device run 41: serving a 3-layer nn.LSTM of 1024 (input 128) in half
precision, eval under inference_mode, at batches 1, 8, 32 and 64 of 200 steps, with a
linear head on the last step."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
dt = torch.float16 if device == "cuda" else torch.float32
rnn = nn.LSTM(128, 1024, num_layers=3, batch_first=True).to(device, dt).eval()
head = nn.Linear(1024, 16).to(device, dt).eval()
outs = []
with torch.inference_mode():
    for b in (1, 8, 32, 64):
        x = torch.randn(b, 200, 128, device=device, dtype=dt)
        y, (h, c) = rnn(x)
        outs.append(head(y[:, -1]).float().sum().item())
print(sum(outs))
