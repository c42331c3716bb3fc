"""Side stream: pinned CPU batches copied on a torch.cuda.Stream, wait_stream + record_stream, and side-stream work on a main-stream tensor."""
import argparse
import os

import torch
import torch.nn as nn

device = "cuda"
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
copy_stream = torch.cuda.Stream()
stats_stream = torch.cuda.Stream()

host_batches = [torch.randn(args.batch, 4096).pin_memory() for _ in range(args.steps)]
host_labels = [torch.randint(0, 1000, (args.batch,)).pin_memory() for _ in range(args.steps)]


def prefetch(i):
    with torch.cuda.stream(copy_stream):
        x = host_batches[i].to(device, non_blocking=True)
        y = host_labels[i].to(device, non_blocking=True)
    return x, y


nxt = prefetch(0)
for step in range(args.steps):
    torch.cuda.current_stream().wait_stream(copy_stream)
    x, y = nxt
    x.record_stream(torch.cuda.current_stream())
    y.record_stream(torch.cuda.current_stream())
    if step + 1 < args.steps:
        nxt = prefetch(step + 1)
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    # activation statistics on a side stream, off the critical path
    feats = out.detach()
    stats_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stats_stream):
        feats.record_stream(stats_stream)
        mean = feats.mean(0)
        var = (feats - mean).pow(2).mean(0)
    del feats, out, x, y
torch.cuda.synchronize()
