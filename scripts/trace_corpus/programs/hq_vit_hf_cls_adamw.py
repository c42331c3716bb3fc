"""Written for device run 28: transformers' ViTForImageClassification (small config, random
init) trained in fp32 with AdamW (foreach, the default), 3 steps of batch 16 at 224 x 224,
labels given to the model (its own cross-entropy)."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                             intermediate_size=1536, image_size=224, patch_size=16, num_labels=10)
model = transformers.ViTForImageClassification(cfg).to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(args.steps):
    px = torch.randn(args.batch, 3, 224, 224, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    loss = model(pixel_values=px, labels=y).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print(float(loss))
