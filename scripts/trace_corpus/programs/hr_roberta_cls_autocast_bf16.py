"""Written for device run 28: transformers' RoBERTa sequence classification trained 3 steps
in fp32 weights under bf16 autocast with fused AdamW and a linear warmup schedule, padded
batches of 16 x 256 (a quarter of each row padding), then one eval pass under no_grad."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.RobertaConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                                 intermediate_size=2048, vocab_size=30000, num_labels=3,
                                 max_position_embeddings=514)
model = transformers.RobertaForSequenceClassification(cfg).to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
sched = transformers.get_linear_schedule_with_warmup(opt, 1, 3)
for step in range(3):
    ids = torch.randint(3, cfg.vocab_size, (16, 256), device=device)
    mask = torch.ones_like(ids)
    mask[:, -64:] = 0
    labels = torch.randint(0, 3, (16,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
model.eval()
with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
    logits = model(input_ids=ids, attention_mask=mask).logits
print(tuple(logits.shape))
