"""Written for device run 40: weight-only int8 inference. A 6-layer Llama-style MLP stack
(4096 -> 11008 -> 4096, SiLU gate) whose weights are kept as int8 with a bf16 per-row scale and
dequantized to bf16 inside each forward (w.to(bf16) * scale), under torch.inference_mode,
over 4 batches of 8 x 512 tokens."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)


class QLinear(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        w = torch.randn(n_out, n_in, device=device) * 0.02
        s = w.abs().amax(dim=1, keepdim=True) / 127
        self.register_buffer("q", (w / s).round().to(torch.int8))
        self.register_buffer("s", s.to(torch.bfloat16))

    def forward(self, x):
        return F.linear(x, self.q.to(torch.bfloat16) * self.s)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up = QLinear(4096, 11008), QLinear(4096, 11008)
        self.down = QLinear(11008, 4096)

    def forward(self, x):
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


model = nn.Sequential(*[MLP() for _ in range(6)])
with torch.inference_mode():
    for _ in range(4):
        x = torch.randn(8, 512, 4096, device=device, dtype=torch.bfloat16)
        y = model(x)
print(float(y.float().abs().mean()))
