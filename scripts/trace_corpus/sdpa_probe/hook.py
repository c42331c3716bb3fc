"""Which SDPA backend PyTorch picks inside real programs, and why the others refuse: runs each
program (programs/NAME.py, as __main__) with torch.nn.functional.scaled_dot_product_attention
wrapped; per distinct call signature (shapes, strides, dtypes, mask, flags, grad mode) it
asks torch.backends.cuda.can_use_{cudnn,flash,efficient}_attention(SDPAParams, debug=True),
keeps their warnings, and records the allocations the call itself made (memory history
around it). Run on the GPU, from scripts/trace_corpus:

    python sdpa_probe/hook.py OUT.json PROG [PROG ...]
"""
import json
import os
import runpy
import sys

import torch
import torch.nn.functional as F

from backends import ask

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIG = F.scaled_dot_product_attention
rows, seen = [], set()
prog = None


def desc(t):
    if t is None:
        return None
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype),
            "offset": t.storage_offset(), "rg": t.requires_grad}


def wrapped(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    sig = (prog, tuple(q.shape), q.stride(), tuple(k.shape), k.stride(), tuple(v.shape), v.stride(),
           str(q.dtype), None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.stride(),
                                                          str(attn_mask.dtype), attn_mask.requires_grad),
           dropout_p, is_causal, enable_gqa, torch.is_grad_enabled(), q.requires_grad)
    if sig in seen or len(rows) > 400:
        return ORIG(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)
    seen.add(sig)
    row = {"prog": prog, "q": desc(q), "k": desc(k), "v": desc(v), "mask": desc(attn_mask),
           "dropout_p": dropout_p, "is_causal": is_causal, "enable_gqa": enable_gqa,
           "grad_enabled": torch.is_grad_enabled()}
    try:
        p = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
        ask(p, row, limit=300)
    except Exception as e:  # noqa: BLE001 - record, do not stop the program
        row["error"] = repr(e)[:300]
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=10000)
    out = ORIG(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
               scale=scale, enable_gqa=enable_gqa)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    row["events"] = [[e["action"], e["size"]] for tr in snap["device_traces"] for e in tr
                     if e["action"] in ("alloc", "free_requested")][-16:]
    row["grad_fn"] = type(out.grad_fn).__name__ if out.grad_fn is not None else None
    rows.append(row)
    return out


F.scaled_dot_product_attention = wrapped
torch.nn.functional.scaled_dot_product_attention = wrapped
out_path = sys.argv[1]
for name in sys.argv[2:]:
    prog = name
    saved = sys.argv
    sys.argv = [name]
    try:
        runpy.run_path(os.path.join(HERE, "programs", name + ".py"), run_name="__main__")
    except Exception as e:  # noqa: BLE001
        rows.append({"prog": name, "error": repr(e)[:500]})
    sys.argv = saved
    torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                   "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=0)
print("probed", len(rows), "calls")
