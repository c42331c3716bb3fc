"""DDP training as torchrun runs it (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR from the env, NCCL):
an MLP wrapped in DistributedDataParallel (bucket_cap_mb), AdamW, a few steps. Rank-dependent
data: rank r trains on batch + r * --batch-step rows (uneven shards), so the ranks' peaks differ.
Without RANK in the env it runs as one process, unwrapped (nanoGPT's convention).

    torchrun --nproc-per-node 4 dist_ddp_train.py --batch 256 --batch-step 64
    python -m vramroom.trace.ranks --world-size 4 -- dist_ddp_train.py --batch 256 --batch-step 64
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--batch-step", type=int, default=0, help="extra rows per rank index (uneven data)")
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--bucket-cap-mb", type=float, default=25.0)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    rank, world_size, device = 0, 1, torch.device("cuda")

torch.manual_seed(0)
h = args.hidden
model = nn.Sequential(
    nn.Linear(1024, h), nn.ReLU(),
    nn.Linear(h, h), nn.ReLU(),
    nn.Linear(h, h), nn.ReLU(),
    nn.Linear(h, 10),
).to(device)
if ddp:
    model = DDP(model, device_ids=[local_rank], bucket_cap_mb=args.bucket_cap_mb)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()

batch = args.batch + rank * args.batch_step
for step in range(args.steps):
    x = torch.randn(batch, 1024, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}")

if ddp:
    dist.destroy_process_group()
