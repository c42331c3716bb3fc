"""Written for device run 29: a DPO-style objective over transformers' GPT-2 (4 layers):
per-token log-probs picked from log_softmax with three broadcast index tensors (batch
arange [B, 1], position arange [1, T], int32 labels [B, T]), summed per sequence, the
sigmoid loss between the two halves of the batch; AdamW, fp32, batch 8 x 192, 3 steps."""
import os

import torch
import torch.nn.functional as F
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=512, vocab_size=32000)
model = transformers.GPT2LMHeadModel(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
B, T = 8, 192
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1), device=device)
    labels = ids[:, 1:].to(torch.int32)
    logp = model(input_ids=ids[:, :-1]).logits.log_softmax(-1)
    rows = torch.arange(B, device=device)[:, None]
    cols = torch.arange(T, device=device)[None, :]
    seq = logp[rows, cols, labels].sum(-1)
    chosen, rejected = seq[: B // 2], seq[B // 2:]
    loss = -F.logsigmoid(0.1 * (chosen - rejected)).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
