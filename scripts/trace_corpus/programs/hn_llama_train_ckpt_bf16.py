"""Written for device run 27: transformers' Llama (small, GQA) trained in bf16 weights with
gradient checkpointing (model.gradient_checkpointing_enable), fused AdamW and gradient
clipping, 3 steps of batch 4 x 512."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                               num_attention_heads=12, num_key_value_heads=4, vocab_size=32000)
model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16)
model.gradient_checkpointing_enable()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
for step in range(args.steps):
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
