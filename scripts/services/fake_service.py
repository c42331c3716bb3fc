"""A CPU stand-in for the GPU services, on the torch stub (crates/vramroom-load/tests/
fixtures/torch_stub): the same common.py server and probe, a 64 MiB "model", and each
request holding `k` x 20 MiB (its body says k) for a few milliseconds. With --fraction the
stub allocator refuses past fraction x 80 GiB, as PyTorch does, so the service really runs
out of memory at a known concurrency. Used by the dry mode of gpu_run_c.sh and by tests;
run it with the stub first on PYTHONPATH."""
import time

import common

MIB = 1 << 20


def load():
    import torch

    return [torch.cuda._stub_alloc(64 * MIB)]


def handle(state, body, probe):
    import torch

    k = max(1, min(int(body.get("k", 1)), 64))
    with probe.request(items=k):
        a = torch.cuda._stub_alloc(k * 20 * MIB)
        time.sleep(0.08)
        torch.cuda._stub_free(a)
    return {"k": k}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
