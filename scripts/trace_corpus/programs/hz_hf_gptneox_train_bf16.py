"""Written for device run 32: transformers GPTNeoXForCausalLM (small, partial rotary, parallel
residual) trained with the model in bf16, AdamW (foreach), batch 4 x 384, 3 steps, then
greedy generate() of 16 tokens from 2 prompts of 32."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = transformers.GPTNeoXConfig(vocab_size=12000, hidden_size=512, num_hidden_layers=4,
                                 num_attention_heads=8, intermediate_size=2048,
                                 rotary_pct=0.25, max_position_embeddings=512,
                                 use_parallel_residual=True)
model = transformers.GPTNeoXForCausalLM(cfg).to(device, dtype=torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (4, 384), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
model.eval()
with torch.no_grad():
    out = model.generate(torch.randint(0, cfg.vocab_size, (2, 32), device=device),
                         max_new_tokens=16, do_sample=False, pad_token_id=0)
print(float(loss), out.shape)
