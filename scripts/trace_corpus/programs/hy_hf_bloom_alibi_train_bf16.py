"""Written for device run 29: transformers' BloomForCausalLM (small; ALiBi attention through
baddbmm, no SDPA) trained under bf16 autocast with AdamW, a padded batch with an attention
mask, batch 8 x 256, 3 steps."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.BloomConfig(hidden_size=512, n_layer=4, n_head=8, vocab_size=32000)
model = transformers.BloomForCausalLM(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (8, 256), device=device)
    mask = torch.ones_like(ids)
    mask[::2, 200:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print(float(loss))
