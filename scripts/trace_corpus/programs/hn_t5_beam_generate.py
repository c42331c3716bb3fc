"""Written for device run 27: transformers' T5 (small config, random init) as an
encoder-decoder, beam search with model.generate(num_beams=3) over padded inputs (an attention
mask with zeros), batch 8, 16 new tokens, bf16, no_grad."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--src", type=int, default=96)
p.add_argument("--new", type=int, default=16)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.T5Config(d_model=256, d_ff=1024, num_layers=3, num_decoder_layers=3,
                            num_heads=4, d_kv=64, vocab_size=32128, decoder_start_token_id=0,
                            pad_token_id=0, eos_token_id=1)
model = transformers.T5ForConditionalGeneration(cfg).to(device=device, dtype=torch.bfloat16).eval()
ids = torch.randint(2, cfg.vocab_size, (args.batch, args.src), device=device)
mask = torch.ones_like(ids)
mask[: args.batch // 2, args.src * 3 // 4:] = 0  # half the batch is padded
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=3,
                         max_new_tokens=args.new, min_new_tokens=args.new)
print(out.shape)
