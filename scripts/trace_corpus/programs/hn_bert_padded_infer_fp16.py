"""Written for device run 27: transformers' BERT (base size, random init) in fp16 inference
over a padded batch (attention mask with zeros: SDPA with a mask), batch 32 x 128, three
batches of different padding, inference_mode."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--seq", type=int, default=128)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.BertConfig()
model = transformers.BertModel(cfg).to(device=device, dtype=torch.float16).eval()
with torch.inference_mode():
    for cut in (args.seq, args.seq * 3 // 4, args.seq // 2):
        ids = torch.randint(1000, cfg.vocab_size, (args.batch, args.seq), device=device)
        mask = torch.ones_like(ids)
        mask[::2, cut:] = 0
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
print(pooled.shape)
