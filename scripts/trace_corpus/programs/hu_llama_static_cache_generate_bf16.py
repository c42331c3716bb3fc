"""Written for device run 39: greedy generation from a 4-layer HF Llama in bf16 with
cache_implementation="static" (the KV cache allocated at full length up front and written in
place; disable_compile=True keeps generate eager), batch 4 x 96-token prompts, 32 new tokens, then a second call with other prompts."""
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=12000, hidden_size=512, intermediate_size=1376,
                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
for call in range(2):
    ids = torch.randint(3, 12000, (4, 96), device=device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                         do_sample=False, cache_implementation="static", eos_token_id=None,
                         disable_compile=True)
print(tuple(out.shape))
