"""Written for device run 26: retrieval scoring without grad: a 1024 x 200k score matrix, topk
of 100 per query, the candidates re-sorted by a second score, and a full argsort of a few
queries' scores (cub's segmented radix sort over 200k), 3 rounds, fp32."""
import argparse
import os

import torch
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
p = argparse.ArgumentParser()
p.add_argument("--queries", type=int, default=1024)
p.add_argument("--docs", type=int, default=200_000)
p.add_argument("--rounds", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
index = F.normalize(torch.randn(args.docs, 256, device=device), dim=-1)
popularity = torch.rand(args.docs, device=device)
with torch.no_grad():
    for _ in range(args.rounds):
        q = F.normalize(torch.randn(args.queries, 256, device=device), dim=-1)
        scores = q @ index.T
        top_scores, top_idx = scores.topk(100, dim=1)
        rerank = top_scores * popularity[top_idx]
        order = rerank.argsort(dim=1, descending=True)
        best = torch.gather(top_idx, 1, order)
        full = scores[:16].argsort(dim=1, descending=True)
        del scores
print(best.shape, full.shape)
