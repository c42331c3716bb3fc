"""Written for device run 39: DPO preference training. A 4-layer HF GPT-2 policy and a frozen
copy as reference (requires_grad_(False), run under torch.no_grad); chosen and rejected
completions in one batch of 2 x 8 sequences of 192 tokens, per-sequence log-probabilities by
log_softmax + gather over the completion mask, loss -logsigmoid(beta * margin), bf16 autocast,
AdamW (foreach), 3 steps."""
import copy
import os

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
policy = GPT2LMHeadModel(GPT2Config(vocab_size=8000, n_positions=256, n_embd=256, n_layer=4,
                                    n_head=8)).to(device)
ref = copy.deepcopy(policy).requires_grad_(False).eval()
opt = torch.optim.AdamW(policy.parameters(), lr=1e-5)
B, L, P = 8, 192, 64


def seq_logps(model, ids, mask):
    logits = model(input_ids=ids).logits[:, :-1].float()
    lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:, None]).squeeze(2)
    return (lp * mask[:, 1:]).sum(-1)


for step in range(3):
    ids = torch.randint(0, 8000, (2 * B, L), device=device)
    mask = torch.zeros(2 * B, L, device=device)
    mask[:, P:] = 1
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        pol = seq_logps(policy, ids, mask)
        with torch.no_grad():
            rf = seq_logps(ref, ids, mask)
    margin = (pol[:B] - rf[:B]) - (pol[B:] - rf[B:])
    loss = -F.logsigmoid(0.1 * margin).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
