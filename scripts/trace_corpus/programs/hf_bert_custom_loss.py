"""transformers BertModel (no head, 6 layers) with a custom in-batch contrastive loss on mean-pooled outputs, AdamW."""
import argparse
import os

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--seq", type=int, default=128)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
config = BertConfig(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048)
model = BertModel(config, add_pooling_layer=False).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)


def embed(ids, mask):
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
    return F.normalize(pooled, dim=-1)


model.train()
for step in range(args.steps):
    q = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    d = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    mask = torch.ones(args.batch, args.seq, dtype=torch.long, device=device)
    mask[:, args.seq // 2:] = 0  # padded second half
    sim = embed(q, mask) @ embed(d, mask).T / 0.05
    labels = torch.arange(args.batch, device=device)
    loss = (F.cross_entropy(sim, labels) + F.cross_entropy(sim.T, labels)) / 2
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if device == "cuda":
    torch.cuda.synchronize()
