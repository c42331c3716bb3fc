"""Written for device run 46, traced before it ran (blind): an audio classifier on GPU-side
features, torch.stft (n_fft 512, hop 128, Hann window) of one-second 16 kHz clips, log power,
a small 2-d CNN with global pooling, cross-entropy, AdamW; batch 32, 3 steps, then features
of a batch of 64 clips under no_grad."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
window = torch.hann_window(512, device=device)


def features(wave):
    spec = torch.stft(wave, 512, hop_length=128, window=window, return_complex=True)
    return torch.log1p(spec.abs() ** 2).unsqueeze(1)


model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(64, 35)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    wave = torch.randn(32, 16384, device=device)
    y = torch.randint(0, 35, (32,), device=device)
    loss = F.cross_entropy(model(features(wave)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    f = features(torch.randn(64, 16384, device=device))
print(float(loss), f.shape)
