"""Written for device run 29: a convolutional VAE (strided convs down, ConvTranspose2d up,
LeakyReLU, BatchNorm), the reparameterisation with randn_like, a BCE-with-logits
reconstruction plus KL loss, Adam, fp32, batch 32 at 64 x 64, 3 steps, then sampling 64
images from the prior under no_grad."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
Z = 128


def down(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 4, 2, 1), nn.BatchNorm2d(o), nn.LeakyReLU(0.2))


def up(i, o):
    return nn.Sequential(nn.ConvTranspose2d(i, o, 4, 2, 1), nn.BatchNorm2d(o), nn.LeakyReLU(0.2))


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(down(3, 32), down(32, 64), down(64, 128), down(128, 256))
        self.mu, self.logvar = nn.Linear(256 * 16, Z), nn.Linear(256 * 16, Z)
        self.fc = nn.Linear(Z, 256 * 16)
        self.dec = nn.Sequential(up(256, 128), up(128, 64), up(64, 32), nn.ConvTranspose2d(32, 3, 4, 2, 1))

    def decode(self, z):
        return self.dec(self.fc(z).view(-1, 256, 4, 4))

    def forward(self, x):
        h = self.enc(x).flatten(1)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decode(z), mu, logvar


model = VAE().to(device)
opt = torch.optim.Adam(model.parameters(), lr=2e-4)
for step in range(3):
    x = torch.rand(32, 3, 64, 64, device=device)
    rec, mu, logvar = model(x)
    bce = F.binary_cross_entropy_with_logits(rec, x, reduction="sum") / x.shape[0]
    kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1))
    loss = bce + kl
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    samples = torch.sigmoid(model.decode(torch.randn(64, Z, device=device)))
print(float(loss), samples.shape)
