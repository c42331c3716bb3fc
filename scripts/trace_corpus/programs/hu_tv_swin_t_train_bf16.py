"""Written for device run 39: torchvision swin_t (shifted windows: roll, pad, window
partition, relative position bias, stochastic depth) trained under bf16 autocast with AdamW
(foreach), batch 8 at 224 x 224, 2 steps."""
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.swin_t(num_classes=10).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
for step in range(2):
    x = torch.randn(8, 3, 224, 224, device=device)
    y = torch.randint(0, 10, (8,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
