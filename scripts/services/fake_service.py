"""A CPU stand-in for the GPU services, on the torch stub (crates/vramroom-load/tests/
fixtures/torch_stub): the same common.py server and probe, a 64 MiB "model", and each
request holding `k` x 20 MiB (its body says k) for a few milliseconds. With --fraction or
--cap-gib the stub allocator refuses past the cap, as PyTorch does, so the service really
runs out of memory at a known concurrency. Used by the dry mode of gpu_run_c.sh and
gpu_run_d.sh and by tests; run it with the stub first on PYTHONPATH.

FAKE_MODE (environment) says how it tags its requests: `items` (default: items=k, the
cost's driver), `bytes` (no tag of its own: only track_handler's body length, which the
body's padding makes vary independently of k: nothing the run sees explains the cost).
FAKE_SLEEP_S: how long a request holds its memory (default 0.08)."""
import os
import time

import common

MIB = 1 << 20
MODE = os.environ.get("FAKE_MODE", "items")
SLEEP = float(os.environ.get("FAKE_SLEEP_S", "0.08"))


def load():
    import torch

    return [torch.cuda._stub_alloc(64 * MIB)]


def handle(state, body, probe):
    import contextlib

    import torch

    k = max(1, min(int(body.get("k", 1)), 64))
    ctx = probe.request(items=k) if MODE == "items" else contextlib.nullcontext()
    with ctx:
        a = torch.cuda._stub_alloc(k * 20 * MIB)
        time.sleep(SLEEP)
        torch.cuda._stub_free(a)
    return {"k": k}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
