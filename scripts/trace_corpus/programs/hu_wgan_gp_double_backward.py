"""Written for device run 39: a WGAN-GP on 32 x 32 images. A ConvTranspose2d generator and a
Conv2d/LeakyReLU critic, the gradient penalty through torch.autograd.grad(create_graph=True)
(a double backward through the convolutions), Adam (foreach) with betas (0.5, 0.9) for both,
two critic steps per generator step, batch 64, 2 rounds."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
gen = nn.Sequential(
    nn.ConvTranspose2d(128, 256, 4, 1, 0), nn.BatchNorm2d(256), nn.ReLU(),
    nn.ConvTranspose2d(256, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
    nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
    nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh(),
).to(device)
critic = nn.Sequential(
    nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(128, 256, 4, 2, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(256, 1, 4, 1, 0), nn.Flatten(),
).to(device)
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4, betas=(0.5, 0.9))
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
B = 64
for rnd in range(2):
    for _ in range(2):
        real = torch.randn(B, 3, 32, 32, device=device)
        z = torch.randn(B, 128, 1, 1, device=device)
        with torch.no_grad():
            fake = gen(z)
        eps = torch.rand(B, 1, 1, 1, device=device)
        x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
        gp = ((g.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
        loss_c = critic(fake).mean() - critic(real).mean() + 10 * gp
        opt_c.zero_grad(set_to_none=True)
        loss_c.backward()
        opt_c.step()
    z = torch.randn(B, 128, 1, 1, device=device)
    loss_g = -critic(gen(z)).mean()
    opt_g.zero_grad(set_to_none=True)
    loss_g.backward()
    opt_g.step()
print(float(loss_c), float(loss_g))
