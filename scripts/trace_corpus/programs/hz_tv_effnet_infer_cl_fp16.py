"""Written for device run 32: torchvision efficientnet_b0 inference in fp16 with the model
and inputs in channels_last, built on the host and moved with .to(device, memory_format=...),
under torch.no_grad(), batch 64 at 224 x 224, 3 batches; argmax and softmax max per image."""
import os

import torch
import torchvision

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
dt = torch.float16 if device == "cuda" else torch.float32
model = torchvision.models.efficientnet_b0().eval()
model = model.to(device, dtype=dt, memory_format=torch.channels_last)
preds = []
with torch.no_grad():
    for i in range(3):
        x = torch.randn(64, 3, 224, 224).to(device, dtype=dt, memory_format=torch.channels_last)
        logits = model(x)
        preds.append((logits.argmax(-1), logits.softmax(-1).amax(-1)))
print(len(preds), preds[0][0].shape)
