"""Written for device run 41: a time-series forecaster, an nn.RNN (ReLU, 2 layers of 128,
sequence-first) feeding an nn.GRU of 256 whose final hidden state predicts the next 24
values; MSE loss, SGD with momentum; batch 128 windows of 168 steps of 12 features."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
F_IN, T, B, HOR = 12, 168, 128, 24


class Forecast(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(F_IN, 128, num_layers=2, nonlinearity="relu")
        self.gru = nn.GRU(128, 256)
        self.head = nn.Linear(256, HOR)

    def forward(self, x):
        y, _ = self.rnn(x)
        _, h = self.gru(y)
        return self.head(h[-1])


model = Forecast().to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
series = torch.randn(T + HOR + 40, B, F_IN, device=device)
for step in range(4):
    x = series[step:step + T]
    target = series[step + T:step + T + HOR, :, 0].t()
    loss = nn.functional.mse_loss(model(x), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(float(loss))
