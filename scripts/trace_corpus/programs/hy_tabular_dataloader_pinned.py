"""Written for device run 29: a tabular MLP (BatchNorm1d, Dropout, SiLU) trained from a
DataLoader over a CPU TensorDataset with pin_memory=True, batches moved with
.to(device, non_blocking=True), Adam with an ExponentialLR, an eval pass over a second
loader under no_grad with predictions concatenated; 8 batches of 512 rows of 256 features."""
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
X, y = torch.randn(4096, 256), torch.randint(0, 20, (4096,))
train = DataLoader(TensorDataset(X, y), batch_size=512, shuffle=True, pin_memory=device == "cuda")
test = DataLoader(TensorDataset(X[:2048], y[:2048]), batch_size=1024, pin_memory=device == "cuda")
model = nn.Sequential(nn.Linear(256, 1024), nn.BatchNorm1d(1024), nn.SiLU(), nn.Dropout(0.2),
                      nn.Linear(1024, 1024), nn.BatchNorm1d(1024), nn.SiLU(), nn.Dropout(0.2),
                      nn.Linear(1024, 20)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.9)
model.train()
for xb, yb in train:
    xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
sched.step()
model.eval()
preds = []
with torch.no_grad():
    for xb, _ in test:
        preds.append(model(xb.to(device, non_blocking=True)).argmax(1))
print(float(loss), torch.cat(preds).shape)
