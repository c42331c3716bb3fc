"""Written for device run 40: a small HF Mamba (4 layers of 256, state 16) trained as a causal
LM on 8 x 128 tokens: without the CUDA kernels package, transformers' slow path (Conv1d over
time, the selective scan as a Python loop over positions), AdamW (foreach), 2 steps."""
import os

import torch
from transformers import MambaConfig, MambaForCausalLM

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = MambaConfig(vocab_size=4000, hidden_size=256, state_size=16, num_hidden_layers=4,
                  expand=2, conv_kernel=4, use_cache=False)
model = MambaForCausalLM(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
for step in range(2):
    ids = torch.randint(0, 4000, (8, 128), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
