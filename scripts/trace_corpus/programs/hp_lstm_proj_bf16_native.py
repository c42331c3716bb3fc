"""Written for device run 41: an nn.LSTM with proj_size (2 layers, 384 hidden projected to
128) and an nn.GRU after it, the whole model in bfloat16, which cuDNN's RNN does not take:
PyTorch runs its own fused cells step by step. Trained with AdamW; batch 24 by 64 steps."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(80, 384, num_layers=2, proj_size=128, batch_first=True)
        self.gru = nn.GRU(128, 128, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        y, h = self.gru(y)
        return self.head(y.mean(1) + h[-1])


model = Net().to(device, torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(24, 64, 80, device=device, dtype=torch.bfloat16)
    y = torch.randint(0, 10, (24,), device=device)
    loss = nn.functional.cross_entropy(model(x).float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
