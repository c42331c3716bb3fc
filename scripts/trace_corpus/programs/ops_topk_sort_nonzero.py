"""Retrieval-style scoring without grad: matmul scores, topk, sort, boolean mask + nonzero (data-dependent size), gather."""
import argparse
import os

import torch
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--queries", type=int, default=1024)
p.add_argument("--docs", type=int, default=200_000)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
index = F.normalize(torch.randn(args.docs, 256, device=device), dim=-1)
doc_len = torch.randint(10, 500, (args.docs,), device=device)

with torch.no_grad():
    for step in range(args.steps):
        q = F.normalize(torch.randn(args.queries, 256, device=device), dim=-1)
        scores = q @ index.T
        top_scores, top_idx = scores.topk(100, dim=1)
        sorted_len, order = doc_len[top_idx].sort(dim=1, descending=True)
        hits = (scores > 0.2).nonzero()
        hit_docs = hits[:, 1]
        hit_len = doc_len.index_select(0, hit_docs)
        ranked = torch.argsort(top_scores * sorted_len.float(), dim=1)
        del scores
if device == "cuda":
    torch.cuda.synchronize()
