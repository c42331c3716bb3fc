"""Written for device run 29: transformers' Qwen2ForCausalLM (small, GQA 8 heads / 2 kv heads,
tied embeddings) trained in fp32 with AdamW(foreach), clip_grad_norm_ every step,
gradients zeroed in place (set_to_none=False), batch 4 x 512, 3 steps, one loss.item()
per step."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.Qwen2Config(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                               max_position_embeddings=1024, tie_word_embeddings=True)
model = transformers.Qwen2ForCausalLM(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
losses = []
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (4, 512), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    losses.append(loss.item())
print(losses)
