"""Written for device run 45, traced before it ran (blind): transformers' ALBERT (one
transformer layer shared across 8, factorised 128-d embeddings) for sequence classification
with an attention mask of padded rows, fp16 autocast with a GradScaler, AdamW, a linear
warmup schedule; batch 16 x 256, 3 steps."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768,
                                num_hidden_layers=8, num_attention_heads=12,
                                intermediate_size=3072, num_labels=3)
model = transformers.AlbertForSequenceClassification(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
sched = transformers.get_linear_schedule_with_warmup(opt, 10, 100)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
model.train()
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (16, 256), device=device)
    mask = torch.ones(16, 256, dtype=torch.long, device=device)
    mask[8:, 192:] = 0
    labels = torch.randint(0, 3, (16,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
