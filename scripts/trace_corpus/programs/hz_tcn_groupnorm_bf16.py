"""Written for device run 32: a temporal convolutional network (dilated Conv1d, GroupNorm,
GELU, residuals) over [batch, channels, time] sequences under bf16 autocast, per-sequence
standardisation with var_mean, a regression head on the last step, Adam (foreach), batch 32 x
2048 steps of 64 channels, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class TBlock(nn.Module):
    def __init__(self, c, d):
        super().__init__()
        self.conv = nn.Conv1d(c, c, 3, padding=d, dilation=d)
        self.norm = nn.GroupNorm(8, c)

    def forward(self, x):
        return x + F.gelu(self.norm(self.conv(x)))


net = nn.Sequential(nn.Conv1d(64, 128, 1), *[TBlock(128, 2 ** i) for i in range(6)]).to(device)
head = nn.Linear(128, 8).to(device)
opt = torch.optim.Adam(list(net.parameters()) + list(head.parameters()), lr=1e-3)
for step in range(3):
    x = torch.randn(32, 64, 2048, device=device)
    var, mean = torch.var_mean(x, dim=-1, keepdim=True)
    x = (x - mean) / (var + 1e-5).sqrt()
    y = torch.randn(32, 8, device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        h = net(x)
        out = head(h[:, :, -1])
    loss = F.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
