"""Written for device run 40: torchvision deeplabv3_mobilenet_v3_large (dilated depthwise
convs, ASPP with global pooling, bilinear upsampling, auxiliary head) trained for semantic
segmentation with per-pixel cross-entropy (ignore_index 255) on both heads, SGD with momentum,
batch 8 at 256 x 256, 3 steps, in fp32."""
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
    weights=None, weights_backbone=None, num_classes=21, aux_loss=True).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
for step in range(3):
    x = torch.randn(8, 3, 256, 256, device=device)
    y = torch.randint(0, 21, (8, 256, 256), device=device)
    y[:, :8] = 255
    out = model(x)
    loss = F.cross_entropy(out["out"], y, ignore_index=255) + \
        0.5 * F.cross_entropy(out["aux"], y, ignore_index=255)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
