"""Written for device run 45, traced before it ran (blind): an MLP regressor ending in
nn.Linear(256, 1), trained online one sample at a time (1-row matmuls, which PyTorch's addmm
sends to plain cuBLAS), then at batch 512; SGD; then inference at batches 1 and 7 under
inference_mode."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(),
                      nn.Linear(256, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for batch in (1, 1, 1, 512, 512):
    x = torch.randn(batch, 64, device=device)
    y = torch.randn(batch, 1, device=device)
    loss = F.smooth_l1_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.inference_mode():
    a = model(torch.randn(1, 64, device=device))
    b = model(torch.randn(7, 64, device=device))
print(float(loss), a.shape, b.shape)
