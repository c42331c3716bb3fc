"""Written for device run 29: a plain training loop through accelerate's Accelerator
(mixed_precision="bf16": its autocast wrapper on forward), model, optimizer and DataLoader
passed through prepare(), accelerator.backward, clip_grad_norm_, AdamW, an MLP of
512 -> 4096 -> 4096 -> 100 over 8 batches of 256 rows."""
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
acc = Accelerator(mixed_precision="bf16" if device == "cuda" else "no", cpu=device != "cuda")
model = torch.nn.Sequential(torch.nn.Linear(512, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                            torch.nn.GELU(), torch.nn.Linear(4096, 100))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
dl = DataLoader(TensorDataset(torch.randn(2048, 512), torch.randint(0, 100, (2048,))), batch_size=256)
model, opt, dl = acc.prepare(model, opt, dl)
for x, y in dl:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    acc.backward(loss)
    acc.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
print(acc.device, float(loss))
