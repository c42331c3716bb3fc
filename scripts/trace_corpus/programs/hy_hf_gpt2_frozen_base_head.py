"""Written for device run 29: transformers' GPT-2 (6 layers) fine-tuned with its first four
blocks and embeddings frozen (requires_grad False), AdamW over the trainable rest only,
bf16 autocast, batch 8 x 384, 3 steps."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512)
model = transformers.GPT2LMHeadModel(cfg).to(device)
for p in model.transformer.wte.parameters():
    p.requires_grad_(False)
for p in model.transformer.wpe.parameters():
    p.requires_grad_(False)
for block in model.transformer.h[:4]:
    for p in block.parameters():
        p.requires_grad_(False)
trainable = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(trainable, lr=5e-5, weight_decay=0.01)
model.train()
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (8, 384), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print(float(loss), sum(p.numel() for p in trainable))
