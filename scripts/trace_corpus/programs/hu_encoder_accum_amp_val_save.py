"""Written for device run 39: a custom training loop. A pre-norm nn.TransformerEncoder (4 layers,
d_model 384, batch_first) under fp16 autocast with GradScaler, 4 micro-batches accumulated per
step, unscale + clip_grad_norm_, AdamW with a cosine schedule, 2 steps; then a validation pass
under torch.no_grad in eval mode, torch.cuda.empty_cache(), and the state_dict saved to a
BytesIO."""
import io
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6000, 384)
        layer = nn.TransformerEncoderLayer(384, 6, 1536, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(384, 6000)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)))


model = Net().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
amp = dict(device_type="cuda", dtype=torch.float16, enabled=device == "cuda")
for step in range(2):
    for micro in range(4):
        ids = torch.randint(0, 6000, (16, 128), device=device)
        with torch.autocast(**amp):
            loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()) / 4
        scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    sched.step()
model.eval()
with torch.no_grad(), torch.autocast(**amp):
    ids = torch.randint(0, 6000, (32, 128), device=device)
    val = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
torch.cuda.empty_cache() if device == "cuda" else None
buf = io.BytesIO()
torch.save(model.state_dict(), buf)
print(float(val), buf.tell())
