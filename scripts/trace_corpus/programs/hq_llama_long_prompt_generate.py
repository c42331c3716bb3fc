"""Written for device run 28: transformers' Llama (GQA, 4 layers) in bf16 generating 12
tokens greedily after a 1,000-token prompt, batch 4: long-context decoding, where each new
token's attention reads a key/value cache of about a thousand positions."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--prompt", type=int, default=1000)
p.add_argument("--new", type=int, default=12)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                               num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                               max_position_embeddings=4096)
model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device=device)
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=args.new, min_new_tokens=args.new)
print(out.shape)
