"""Written for device run 39: torchvision shufflenet_v2_x1_0 (depthwise convs, channel
shuffle by view/transpose/contiguous) trained with SGD (Nesterov momentum, weight decay) on
batch 32 at 128 x 128, 3 steps, in fp32."""
import os

import torch
import torch.nn.functional as F
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = torchvision.models.shufflenet_v2_x1_0(num_classes=10).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                      weight_decay=4e-5)
for step in range(3):
    x = torch.randn(32, 3, 128, 128, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
