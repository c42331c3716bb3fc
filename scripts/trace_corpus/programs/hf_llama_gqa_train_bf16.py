"""transformers LlamaForCausalLM (small, GQA 16 heads / 4 kv heads) training with the model in bf16, AdamW."""
import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=512)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
)
model = LlamaForCausalLM(config)
model.to(torch.bfloat16)
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

model.train()
for step in range(args.steps):
    input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    attention_mask = torch.ones_like(input_ids)
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
if device == "cuda":
    torch.cuda.synchronize()
