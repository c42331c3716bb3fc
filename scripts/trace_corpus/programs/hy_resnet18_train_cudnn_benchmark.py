"""Written for device run 29: torchvision ResNet-18 trained with torch.backends.cudnn.benchmark
= True (cuDNN's algorithm search at each new conv shape), SGD with momentum, fp32, batches of
64 then 48 at 160 x 160 (a second search for the last, smaller batch), 3 steps."""
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=50).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for b in (64, 64, 48):
    x = torch.randn(b, 3, 160, 160, device=device)
    y = torch.randint(0, 50, (b,), device=device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
