"""Written for device run 29: transformers' BertForSequenceClassification (6 layers) fine-tuned
on padded batches with an attention mask (lengths vary per row), fp16 autocast and a
GradScaler, AdamW with a linear warmup/decay schedule, gradient clipping, batch 16 x 256,
4 steps, then an eval batch under no_grad with softmax probabilities kept."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
on = device == "cuda"
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.BertConfig(num_hidden_layers=6, num_labels=3, hidden_size=768,
                              num_attention_heads=12, intermediate_size=3072)
model = transformers.BertForSequenceClassification(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
sched = transformers.get_linear_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=4)
scaler = torch.amp.GradScaler("cuda", enabled=on)
B, T = 16, 256


def batch():
    ids = torch.randint(1000, cfg.vocab_size, (B, T), device=device)
    lengths = torch.linspace(64, T, B, device=device).long()
    mask = (torch.arange(T, device=device)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    return ids, mask


model.train()
for step in range(4):
    ids, mask = batch()
    labels = torch.randint(0, 3, (B,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=on):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    scaler.scale(out.loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad(set_to_none=True)
model.eval()
with torch.no_grad():
    ids, mask = batch()
    probs = model(input_ids=ids, attention_mask=mask).logits.softmax(-1)
print(float(out.loss), probs.shape)
