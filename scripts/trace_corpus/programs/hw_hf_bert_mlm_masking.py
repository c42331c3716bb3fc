"""Written for device run 35: transformers BertForMaskedLM (small) trained on randomly masked
tokens made on the GPU as DataCollatorForLanguageModeling does (bernoulli masks, 80/10/10
replacement with masked_fill and where, labels -100 elsewhere), AdamW, fp32, batch 16 x 128,
3 steps."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = transformers.BertConfig(vocab_size=16000, hidden_size=256, num_hidden_layers=4,
                              num_attention_heads=4, intermediate_size=1024)
model = transformers.BertForMaskedLM(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
MASK = 103
for step in range(3):
    ids = torch.randint(1000, cfg.vocab_size, (16, 128), device=device)
    labels = ids.clone()
    prob = torch.full(labels.shape, 0.15, device=device)
    masked = torch.bernoulli(prob).bool()
    labels[~masked] = -100
    replace = torch.bernoulli(torch.full(labels.shape, 0.8, device=device)).bool() & masked
    ids = ids.masked_fill(replace, MASK)
    rand = torch.bernoulli(torch.full(labels.shape, 0.5, device=device)).bool() & masked & ~replace
    ids = torch.where(rand, torch.randint(cfg.vocab_size, labels.shape, device=device), ids)
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
