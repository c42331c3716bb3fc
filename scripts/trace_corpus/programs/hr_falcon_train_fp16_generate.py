"""Written for device run 28: transformers' Falcon (new decoder architecture, multi-query
attention, parallel attention/MLP) trained 2 steps in fp32 under fp16 autocast with a
GradScaler and foreach AdamW, then fp16 sampling generate() with top-k."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=256)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.FalconConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                                vocab_size=20000, new_decoder_architecture=False,
                                multi_query=True, parallel_attn=True, bias=False,
                                pad_token_id=0, eos_token_id=2, bos_token_id=1)
model = transformers.FalconForCausalLM(cfg).to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
scaler = torch.amp.GradScaler("cuda")
for step in range(2):
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.seq), device=device)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
model = model.half().eval()
with torch.no_grad():
    out = model.generate(ids[:, :24], max_new_tokens=24, min_new_tokens=24, do_sample=True,
                         top_k=50)
print(tuple(out.shape))
