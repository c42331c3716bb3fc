"""Written for device run 45, traced before it ran (blind): a reward model, transformers'
GPT2Model (4 layers) with a scalar value head nn.Linear(768, 1) (bias: one output column, so
PyTorch's addmm does not take cuBLASLt), the pairwise loss -logsigmoid(r_chosen - r_rejected)
on the last token, bf16 autocast, AdamW; batch 8 pairs x 256, 3 steps; then scoring one
sequence at a time (a 1-row matmul) under no_grad."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=4, n_embd=768, n_head=12, n_positions=512)
body = transformers.GPT2Model(cfg).to(device)
head = nn.Linear(768, 1).to(device)
opt = torch.optim.AdamW(list(body.parameters()) + list(head.parameters()), lr=1e-5)


def reward(ids):
    h = body(input_ids=ids).last_hidden_state
    return head(h[:, -1]).squeeze(-1)


for step in range(3):
    chosen = torch.randint(0, cfg.vocab_size, (8, 256), device=device)
    rejected = torch.randint(0, cfg.vocab_size, (8, 256), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        r = reward(torch.cat([chosen, rejected]))
    loss = -F.logsigmoid(r[:8].float() - r[8:].float()).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
scores = []
with torch.no_grad():
    for i in range(4):
        scores.append(reward(torch.randint(0, cfg.vocab_size, (1, 200), device=device)))
print(float(loss), torch.cat(scores).shape)
