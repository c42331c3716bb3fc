"""Written for device run 37: LoRA by hand on transformers LlamaForCausalLM (small, GQA) in
bf16: every base weight frozen, rank-8 adapters added to q_proj and v_proj through forward
hooks, AdamW (foreach) over the adapters only, batch 4 x 256, 3 steps."""
import os

import torch
import torch.nn as nn
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=16000, hidden_size=512, intermediate_size=1536,
                               num_hidden_layers=4, num_attention_heads=8,
                               num_key_value_heads=2, max_position_embeddings=512)
model = transformers.LlamaForCausalLM(cfg).to(device, dtype=torch.bfloat16)
for p in model.parameters():
    p.requires_grad_(False)
adapters = nn.ModuleList()


def add_lora(linear):
    a = nn.Linear(linear.in_features, 8, bias=False).to(device, dtype=torch.bfloat16)
    b = nn.Linear(8, linear.out_features, bias=False).to(device, dtype=torch.bfloat16)
    nn.init.zeros_(b.weight)
    adapters.extend([a, b])
    linear.register_forward_hook(lambda mod, inp, out: out + 2.0 * b(a(inp[0])))


for layer in model.model.layers:
    add_lora(layer.self_attn.q_proj)
    add_lora(layer.self_attn.v_proj)
opt = torch.optim.AdamW(adapters.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (4, 256), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
