"""Written for device run 24 (after the embedding backward fix): transformers' T5 (small
config, random weights), encoder-decoder training with labels, AdamW, under bf16 autocast;
8 x 512 source tokens reach the shared embedding's backward sort path."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--src", type=int, default=512)
p.add_argument("--tgt", type=int, default=128)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.T5Config(d_model=256, d_ff=1024, num_layers=4, num_decoder_layers=4,
                            num_heads=4, d_kv=64, decoder_start_token_id=0, pad_token_id=0)
model = transformers.T5ForConditionalGeneration(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(args.steps):
    src = torch.randint(0, cfg.vocab_size, (args.batch, args.src), device=device)
    tgt = torch.randint(0, cfg.vocab_size, (args.batch, args.tgt), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=src, labels=tgt).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
