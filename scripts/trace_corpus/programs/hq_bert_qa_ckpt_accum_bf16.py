"""Written for device run 28: transformers' BertForQuestionAnswering (6 layers) trained with
gradient checkpointing under bf16 autocast, 2 micro-batches accumulated per AdamW step, loss
divided by the accumulation count, 2 steps of micro-batch 8 x 384 with padding."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=384)
p.add_argument("--steps", type=int, default=2)
p.add_argument("--accum", type=int, default=2)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                              intermediate_size=2048, max_position_embeddings=512)
model = transformers.BertForQuestionAnswering(cfg).to(device).train()
model.gradient_checkpointing_enable()
opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
for step in range(args.steps):
    for micro in range(args.accum):
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
        mask = torch.ones_like(ids)
        mask[1::2, args.seq * 2 // 3:] = 0
        start = torch.randint(0, args.seq // 2, (args.batch,), device=device)
        end = start + 5
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            out = model(input_ids=ids, attention_mask=mask, start_positions=start,
                        end_positions=end)
        (out.loss / args.accum).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(out.loss))
