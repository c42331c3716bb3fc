"""Written for device run 28: a transformers Mixtral (mixture of experts, 8 experts, top-2)
trained 2 steps in fp32 with AdamW, then cast to bf16 for greedy generate(). transformers'
experts run torch's grouped GEMM: in fp32 its fallback (one cuBLAS mm per expert), in bf16
on Hopper its CUTLASS kernel with an argument buffer from the caching allocator."""
import argparse
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--steps", type=int, default=2)
args = p.parse_args()

transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.MixtralConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
                                 num_attention_heads=8, num_key_value_heads=2, vocab_size=16000,
                                 num_local_experts=8, num_experts_per_tok=2,
                                 sliding_window=None, pad_token_id=0, eos_token_id=2)
model = transformers.MixtralForCausalLM(cfg).to(device).train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(args.steps):
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.seq), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
del opt
model = model.to(torch.bfloat16).eval()
prompt = torch.randint(3, cfg.vocab_size, (args.batch, 32), device=device)
with torch.no_grad():
    out = model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)
print(float(loss), tuple(out.shape))
