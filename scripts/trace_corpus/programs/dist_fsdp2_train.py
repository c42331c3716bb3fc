"""FSDP2 training as torchrun runs it (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR from the env, NCCL):
a stack of MLP blocks, each block and then the root wrapped with `fully_shard`, AdamW on the
sharded parameters, a few steps. Rank-dependent data: rank r trains on batch + r * --batch-step
rows (uneven shards), so the ranks' peaks differ. Without RANK in the env it runs as one process,
unsharded.

    torchrun --nproc-per-node 4 dist_fsdp2_train.py --batch 256 --batch-step 64
    python -m vramroom.trace.ranks --world-size 4 -- dist_fsdp2_train.py --batch 256 --batch-step 64
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--batch-step", type=int, default=0, help="extra rows per rank index (uneven data)")
p.add_argument("--hidden", type=int, default=4096)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()

distributed = int(os.environ.get("RANK", -1)) != -1
if distributed:
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    rank, device = 0, torch.device("cuda")


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.up = nn.Linear(h, 4 * h)
        self.down = nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, h, n):
        super().__init__()
        self.inp = nn.Linear(1024, h)
        self.blocks = nn.ModuleList(Block(h) for _ in range(n))
        self.out = nn.Linear(h, 10)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


torch.manual_seed(0)
model = Net(args.hidden, args.layers).to(device)
if distributed:
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
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

if distributed:
    dist.destroy_process_group()
