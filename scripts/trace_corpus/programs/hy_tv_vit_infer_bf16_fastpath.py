"""Written for device run 29: torchvision vit_b_16 evaluated in bf16 under torch.inference_mode
(nn.MultiheadAttention's fast path in eval), batches of 1, 8 and 32 images, top-5 of each
kept."""
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.vit_b_16().to(device=device, dtype=torch.bfloat16).eval()
tops = []
with torch.inference_mode():
    for b in (1, 8, 32):
        x = torch.randn(b, 3, 224, 224, device=device, dtype=torch.bfloat16)
        tops.append(model(x).float().softmax(-1).topk(5, dim=-1).indices)
print([t.shape for t in tops])
