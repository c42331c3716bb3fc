"""Written for device run 45, traced before it ran (blind): a DCGAN-style GAN at 64 x 64,
generator of ConvTranspose2d + BatchNorm, discriminator of Conv2d under
nn.utils.parametrizations.spectral_norm (a power iteration at every forward),
BCEWithLogits, two Adam optimizers (betas 0.5, 0.999), alternating D and G updates; batch
32, 3 iterations."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
nz = 100
G = nn.Sequential(
    nn.ConvTranspose2d(nz, 256, 4, 1, 0, bias=False), nn.BatchNorm2d(256), nn.ReLU(True),
    nn.ConvTranspose2d(256, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU(True),
    nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
    nn.ConvTranspose2d(64, 32, 4, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(True),
    nn.ConvTranspose2d(32, 3, 4, 2, 1, bias=False), nn.Tanh()).to(device)
D = nn.Sequential(
    spectral_norm(nn.Conv2d(3, 64, 4, 2, 1)), nn.LeakyReLU(0.2, True),
    spectral_norm(nn.Conv2d(64, 128, 4, 2, 1)), nn.LeakyReLU(0.2, True),
    spectral_norm(nn.Conv2d(128, 256, 4, 2, 1)), nn.LeakyReLU(0.2, True),
    spectral_norm(nn.Conv2d(256, 1, 8, 1, 0)), nn.Flatten()).to(device)
optG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
optD = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
for it in range(3):
    real = torch.rand(32, 3, 64, 64, device=device) * 2 - 1
    z = torch.randn(32, nz, 1, 1, device=device)
    fake = G(z)
    d_real, d_fake = D(real), D(fake.detach())
    lossD = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
        F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
    optD.zero_grad()
    lossD.backward()
    optD.step()
    d_gen = D(fake)
    lossG = F.binary_cross_entropy_with_logits(d_gen, torch.ones_like(d_gen))
    optG.zero_grad()
    lossG.backward()
    optG.step()
print(float(lossD), float(lossG))
