"""Written for device run 46, traced before it ran (blind): a hand-written encoder (4
layers, d 512, 8 heads) over 2,048-token sequences of varying length, F.scaled_dot_product_
attention with a boolean key-padding mask broadcast to [B, 1, 1, T] (not the flash path),
bf16 weights, AdamW fused; batch 4, 3 steps."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
D, H, T, B = 512, 8, 2048, 4


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.n1, self.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, mask):
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        return x + self.ff(self.n2(x))


layers = nn.ModuleList(Layer() for _ in range(4)).to(device, torch.bfloat16)
head = nn.Linear(D, 2).to(device, torch.bfloat16)
params = list(layers.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-4, fused=device == "cuda")
lengths = torch.tensor([2048, 1500, 900, 300], device=device)
mask = (torch.arange(T, device=device)[None] < lengths[:, None])[:, None, None, :]
for step in range(3):
    x = torch.randn(B, T, D, device=device, dtype=torch.bfloat16)
    for layer in layers:
        x = layer(x, mask)
    pooled = (x * mask[:, 0, 0, :, None]).sum(1) / lengths[:, None]
    loss = F.cross_entropy(head(pooled).float(), torch.tensor([0, 1, 0, 1], device=device))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
