"""Which SDPA backend PyTorch picks for masks with one slice per head (T5's position bias), and
why the others refuse: torch.backends.cuda.can_use_*(SDPAParams, debug=True) per case, their
warnings captured. Run on the GPU: python probe.py OUT.json"""
import json
import sys

import torch

from backends import ask

B, H, D = 8, 4, 64


out = []
for dt in (torch.bfloat16, torch.float32):
    for T, S in ((96, 96), (1, 16), (1, 96), (128, 512), (1, 64), (1, 32), (64, 64), (128, 128),
                 (96, 128), (16, 96), (1, 48)):
        for shape in ("BHTS", "B1TS", "B11S", "1HTS", "none", "BHTS_grad", "1HTS_perm",
                      "BHTS_grad_qkv"):
            q = torch.randn(B, H, T, D, device="cuda", dtype=dt)
            k = torch.randn(B, H, S, D, device="cuda", dtype=dt)
            v = torch.randn(B, H, S, D, device="cuda", dtype=dt)
            dims = {"BHTS": (B, H, T, S), "B1TS": (B, 1, T, S), "B11S": (B, 1, 1, S),
                    "1HTS": (1, H, T, S), "BHTS_grad": (B, H, T, S),
                    "BHTS_grad_qkv": (B, H, T, S)}.get(shape)
            m = torch.randn(dims, device="cuda", dtype=dt) if dims else None
            if shape.startswith("BHTS_grad"):  # a learned bias, contiguous
                m.requires_grad_(True)
            if shape == "BHTS_grad_qkv":
                for t in (q, k, v):
                    t.requires_grad_(True)
            if shape == "1HTS_perm":  # T5's position bias: [T, S, H] permuted, stride(-1) == H
                m = torch.randn(T, S, H, device="cuda", dtype=dt).permute(2, 0, 1).unsqueeze(0)
            p = torch.backends.cuda.SDPAParams(q, k, v, m, 0.0, False, False)
            row = {"dtype": str(dt), "T": T, "S": S, "mask": shape}
            ask(p, row)
            torch.cuda.memory._record_memory_history(max_entries=100000)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
            row["grad_fn"] = type(o.grad_fn).__name__ if o.grad_fn is not None else None
            del o
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            allocs = [e["size"] for tr in snap["device_traces"] for e in tr if e["action"] == "alloc"]
            row["allocs"] = allocs[-12:]
            out.append(row)
# head dims: which backend cuDNN 9.19 leaves to the others (bf16, T = S = 128)
for D2, Dv2 in ((96, 96), (128, 128), (160, 160), (192, 128), (192, 192), (256, 256), (72, 72)):
    for mask, grad in ((False, False), (True, False), (False, True)):
        q = torch.randn(2, 4, 128, D2, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        k = torch.randn(2, 4, 128, D2, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        v = torch.randn(2, 4, 128, Dv2, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        m = torch.randn(2, 1, 128, 128, device="cuda", dtype=torch.bfloat16) if mask else None
        p = torch.backends.cuda.SDPAParams(q, k, v, m, 0.0, False, False)
        row = {"dtype": "torch.bfloat16", "T": 128, "S": 128, "D": D2, "Dv": Dv2,
               "mask": "B1TS" if mask else "none", "grad": grad}
        ask(p, row)
        try:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
            row["grad_fn"] = type(o.grad_fn).__name__ if o.grad_fn is not None else None
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:200]
        out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=0)
print(len(out), "cases")
for r in out:
    if r["mask"] != "none":
        print(r["dtype"], r["T"], r["S"], r["mask"], "cudnn", r["cudnn"], "eff", r["efficient"],
              (r["cudnn_why"] + r["efficient_why"])[:2])
