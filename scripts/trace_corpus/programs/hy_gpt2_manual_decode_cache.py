"""Written for device run 29: a hand-written sampling loop over transformers' GPT-2 (6 layers,
fp16) with its KV cache: one prefill of 4 x 200 tokens, then 48 steps that feed the last
token with past_key_values, sample with torch.multinomial over softmax(logits / 0.7), and
grow the ids with torch.cat, under torch.no_grad."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512)
model = transformers.GPT2LMHeadModel(cfg).to(device=device, dtype=torch.float16).eval()
ids = torch.randint(0, cfg.vocab_size, (4, 200), device=device)
with torch.no_grad():
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    nxt = torch.multinomial(torch.softmax(out.logits[:, -1].float() / 0.7, -1), 1)
    for _ in range(48):
        ids = torch.cat([ids, nxt], 1)
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = torch.multinomial(torch.softmax(out.logits[:, -1].float() / 0.7, -1), 1)
print(ids.shape)
