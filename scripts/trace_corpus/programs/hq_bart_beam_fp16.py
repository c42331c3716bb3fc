"""Written for device run 28: transformers' BART (small config, random init) in fp16 as a
summariser, beam search with model.generate(num_beams=4) over padded inputs (attention mask
with zeros), batch 6, source 128, 20 new tokens, no_grad."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=6)
p.add_argument("--src", type=int, default=128)
p.add_argument("--new", type=int, default=20)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.BartConfig(vocab_size=30000, d_model=384, encoder_layers=3, decoder_layers=3,
                              encoder_attention_heads=6, decoder_attention_heads=6,
                              encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                              max_position_embeddings=512, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
model = transformers.BartForConditionalGeneration(cfg).to(device=device, dtype=torch.float16).eval()
ids = torch.randint(3, cfg.vocab_size, (args.batch, args.src), device=device)
mask = torch.ones_like(ids)
mask[::2, args.src // 2:] = 0  # every other row padded to half length
ids = ids.masked_fill(mask == 0, cfg.pad_token_id)
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=mask, num_beams=4,
                         max_new_tokens=args.new, min_new_tokens=args.new)
print(out.shape)
