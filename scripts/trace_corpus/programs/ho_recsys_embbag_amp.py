"""Written for device run 18: a recommendation model (EmbeddingBag tables with mean pooling,
an MLP over their concatenation and dense features), trained under fp16 autocast with a
GradScaler and Adam."""
import argparse
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=2048)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
tables = nn.ModuleList(nn.EmbeddingBag(n, 64, mode="mean") for n in (100000, 50000, 20000, 5000)).to(device)
mlp = nn.Sequential(nn.Linear(4 * 64 + 13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                    nn.Linear(256, 1)).to(device)
params = list(tables.parameters()) + list(mlp.parameters())
opt = torch.optim.Adam(params, lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
for step in range(args.steps):
    ids = [torch.randint(0, t.num_embeddings, (args.batch, 20), device=device) for t in tables]
    dense = torch.randn(args.batch, 13, device=device)
    label = torch.rand(args.batch, 1, device=device)
    with torch.autocast("cuda", dtype=torch.float16):
        feats = torch.cat([t(i) for t, i in zip(tables, ids)] + [dense], dim=1)
        loss = nn.functional.binary_cross_entropy_with_logits(mlp(feats).float(), label)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
