"""Written for device run 35: MAE-style random masking: patch embedding by Conv2d, per-sample
noise argsort (sort), gather of the kept 25% of patches, a small transformer encoder
(nn.TransformerEncoderLayer, batch_first, training) under bf16 autocast, the mask token
scattered back with torch.gather on the restore indices, an MSE loss on the masked patches,
AdamW (foreach), batch 32 at 224 x 224, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
D, P = 256, 16
N = (224 // P) ** 2
patch = nn.Conv2d(3, D, P, P).to(device)
enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 8, 4 * D, batch_first=True), 4).to(device)
dec = nn.Linear(D, P * P * 3).to(device)
mask_token = nn.Parameter(torch.zeros(1, 1, D, device=device))
params = list(patch.parameters()) + list(enc.parameters()) + list(dec.parameters()) + [mask_token]
opt = torch.optim.AdamW(params, lr=1e-4)
for step in range(3):
    img = torch.randn(32, 3, 224, 224, device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        x = patch(img).flatten(2).transpose(1, 2)
        noise = torch.rand(32, N, device=device)
        shuffle = torch.argsort(noise, dim=1)
        restore = torch.argsort(shuffle, dim=1)
        keep = shuffle[:, : N // 4]
        x = torch.gather(x, 1, keep[:, :, None].expand(-1, -1, D))
        x = enc(x)
        full = torch.cat([x, mask_token.expand(32, N - N // 4, D).to(x.dtype)], 1)
        full = torch.gather(full, 1, restore[:, :, None].expand(-1, -1, D))
        pred = dec(full)
    target = img.unfold(2, P, P).unfold(3, P, P).permute(0, 2, 3, 1, 4, 5).reshape(32, N, -1)
    m = torch.ones(32, N, device=device)
    m[:, : N // 4] = 0
    m = torch.gather(m, 1, restore)
    loss = ((pred.float() - target) ** 2).mean(-1).mul(m).sum() / m.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
