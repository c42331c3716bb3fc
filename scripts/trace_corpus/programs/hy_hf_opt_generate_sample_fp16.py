"""Written for device run 29: transformers' OPTForCausalLM (small, random init) in fp16:
model.generate() with sampling (temperature, top_p), num_return_sequences=3, 40 new
tokens from a batch of 2 left-padded prompts of 96 tokens."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.OPTConfig(hidden_size=768, ffn_dim=3072, num_hidden_layers=6,
                             num_attention_heads=12, vocab_size=30000, max_position_embeddings=512,
                             word_embed_proj_dim=768, pad_token_id=1, eos_token_id=2,
                             bos_token_id=2)
model = transformers.OPTForCausalLM(cfg).to(device=device, dtype=torch.float16).eval()
ids = torch.randint(3, cfg.vocab_size, (2, 96), device=device)
mask = torch.ones_like(ids)
ids[1, :20] = cfg.pad_token_id
mask[1, :20] = 0
out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.8,
                     top_p=0.9, num_return_sequences=3, max_new_tokens=40, min_new_tokens=40,
                     pad_token_id=cfg.pad_token_id)
print(out.shape)
