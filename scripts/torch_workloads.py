"""PyTorch workloads under PyTorch's native allocator or Vramroom's (python/vramroom/torch.py).

    python3 scripts/torch_workloads.py MODE OUT.jsonl [--quick]

MODE: native | native-expandable | vramroom | vramroom-expandable. One process per mode: the
allocator must be chosen before CUDA first allocates. Workloads (the same in every mode):
  resnet50_infer_nograd  ResNet-50 fp32 no_grad over batches 1,8,32,64,3,17,48,5,64,1 (the
                         workload of ../shared/traces/resnet50_infer_nograd__*.pickle), 7 passes, the median of the last 6
  resnet50_train_sgd     ResNet-50 training steps, bs32, SGD with momentum (the traces' second
                         workload), 30 steps, the median of the last 25
  gpt2_varlen_infer      a GPT-2 (124M) written in plain torch, no_grad, bs4, sequence length
                         drawn per step from U[32, 1024] with a fixed seed, 40 steps
  gpt2_varlen_serve      the same model as a dynamically batching server sees it: per step a
                         batch of 1, 2, 4, 8 or 16 sequences of one length drawn from
                         U[16, 1024] (fixed seed), full logits, next token per sequence,
                         60 steps
MODE native-record (native-expandable-record) runs native (with expandable segments) and
memory history recording on, and writes each workload's snapshot to VRAMROOM_RECORD_DIR
(`<workload>.pickle`, `<workload>__expandable.pickle`), for `vramroom replay`; its timings
are not comparable (recording costs time). `--only NAME` runs one workload.
CONF overrides the allocator config of the vramroom modes (VRAMROOM_ALLOC_CONF).
Each writes one JSON line: peak allocated/reserved (from the allocator in use), median step
time. In vramroom modes the script also checks the vramroom_torch API and prints
"N passed, M failed" for those checks. Between workloads the cache is emptied and peaks reset.
"""
import gc
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

MODE = sys.argv[1] if len(sys.argv) > 1 else "native"
OUT = sys.argv[2] if len(sys.argv) > 2 else "/tmp/workloads.jsonl"
QUICK = "--quick" in sys.argv
VRAMROOM = MODE.startswith("vramroom")
CONF = "expandable_segments:True" if MODE.endswith("expandable") else ""
if MODE == "vramroom-recommended":
    CONF = os.environ.get("VRAMROOM_ALLOC_CONF", "")
RECORD = os.environ.get("VRAMROOM_RECORD_DIR", "/tmp") if MODE.endswith("-record") else None
ONLY = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--only"]

if MODE in ("native-expandable", "native-expandable-record"):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
elif MODE in ("native", "native-record"):
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

hr = None
if VRAMROOM:
    from vramroom import torch as hr  # noqa: E402

    hr.enable(alloc_conf=CONF)


def stats():
    if hr is not None:
        return hr.max_memory_allocated(0), hr.max_memory_reserved(0)
    return torch.cuda.max_memory_allocated(0), torch.cuda.max_memory_reserved(0)


def reset():
    gc.collect()
    torch.cuda.synchronize()
    if hr is not None:
        hr.empty_cache()
        hr.reset_peak_memory_stats(0)
    else:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(0)


def emit(rec):
    rec.update(mode=MODE, round=int(os.environ.get("VRAMROOM_ROUND", "1")))
    line = json.dumps(rec)
    print(line, flush=True)
    with open(OUT, "a") as f:
        f.write(line + "\n")


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def resnet50():
    import torchvision

    return torchvision.models.resnet50().cuda()


def wl_resnet_infer():
    model = resnet50().eval()
    batches = [1, 8, 32, 64, 3, 17, 48, 5, 64, 1]
    passes = 2 if QUICK else 7
    times = []
    with torch.no_grad():
        for p in range(passes):
            per = []
            for bs in batches:
                x = torch.randn(bs, 3, 224, 224, device="cuda")
                per.append(timed(lambda: model(x)))
                del x
            if p > 0:
                times.append(sum(per) / len(per))
    pa, pr = stats()
    del model
    return dict(workload="resnet50_infer_nograd", peak_allocated=pa, peak_reserved=pr,
                step_ms=statistics.median(times), unit="ms per batch (mean over the sequence)")


def wl_resnet_train():
    model = resnet50().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # 30 steps, the first 5 not timed: with 10 steps (8 timed) the median moved by 30%
    # between two runs of the same allocator.
    steps = 8 if QUICK else 30
    x = torch.randn(32, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (32,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    times = [timed(step) for _ in range(steps)]
    pa, pr = stats()
    del model, opt, x, y
    return dict(workload="resnet50_train_sgd", peak_allocated=pa, peak_reserved=pr,
                step_ms=statistics.median(times[5:]), unit="ms per step (median)")


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, ctx=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def wl_gpt2_varlen_serve():
    import random

    model = GPT2().cuda().eval()
    rng = random.Random(4321)
    steps = 20 if QUICK else 60
    shapes = [(rng.choice([1, 2, 4, 8, 16]), rng.randint(16, 1024)) for _ in range(steps)]
    times = []
    with torch.no_grad():
        for bs, t in shapes:
            idx = torch.randint(0, 50257, (bs, t), device="cuda")
            times.append(timed(lambda: model(idx)[:, -1].argmax(-1)))
            del idx
    pa, pr = stats()
    del model
    return dict(workload="gpt2_varlen_serve", peak_allocated=pa, peak_reserved=pr,
                step_ms=statistics.mean(times[3:]), unit="ms per step (mean)",
                shapes=[min(shapes), max(shapes)])


def wl_gpt2_varlen():
    import random

    model = GPT2().cuda().eval()
    rng = random.Random(1234)
    steps = 15 if QUICK else 40
    lens = [rng.randint(32, 1024) for _ in range(steps)]
    times = []
    with torch.no_grad():
        for t in lens:
            idx = torch.randint(0, 50257, (4, t), device="cuda")
            times.append(timed(lambda: model(idx).argmax(-1)))
            del idx
    pa, pr = stats()
    del model
    return dict(workload="gpt2_varlen_infer", peak_allocated=pa, peak_reserved=pr,
                step_ms=statistics.mean(times[3:]), unit="ms per step (mean)",
                lengths=[min(lens), max(lens)])


def python_pair_ns():
    """ns per malloc+free pair through Python calls (the allocator plus the call overhead)."""
    out = {}
    n = 20000
    if hr is None:
        alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    else:
        lib = hr.library()
        m, f = lib.vramroom_malloc, lib.vramroom_free

        def alloc(s):
            return m(s, 0, None)

        def free(p):
            f(p, 0, 0, None)
    for size in [512, 4096, 1 << 20, 8 << 20, 64 << 20]:
        for _ in range(1000):
            free(alloc(size))
        t = time.perf_counter_ns()
        for _ in range(n):
            free(alloc(size))
        out[size] = (time.perf_counter_ns() - t) / n
    return out


def checks():
    """The vramroom_torch API against what torch.cuda gives."""
    import pickle
    import tempfile

    res = []

    def check(name, fn):
        try:
            fn()
            res.append((name, True, ""))
        except Exception as e:  # noqa: BLE001 - report every failure
            res.append((name, False, repr(e)))

    def routed():
        before = hr.memory_stats()["allocation.all.allocated"]
        x = torch.ones(1000, 1000, device="cuda")
        assert hr.memory_stats()["allocation.all.allocated"] > before
        assert hr.memory_allocated() >= 4_000_000
        assert float(x.sum()) == 1e6

    def stats_keys():
        s = hr.memory_stats()
        assert len(s) == 122, len(s)
        for k in ["allocated_bytes.all.peak", "reserved_bytes.large_pool.current",
                  "num_alloc_retries", "num_ooms", "num_device_alloc"]:
            assert k in s, k

    def summary():
        s = hr.memory_summary()
        assert "PyTorch CUDA memory summary, device ID 0" in s, s[:200]

    def snap():
        d = hr.snapshot()
        assert set(["segments", "device_traces"]) <= set(d), list(d)
        assert len(d["segments"]) > 0
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "s.pickle")
            hr.dump_snapshot(p)
            with open(p, "rb") as f:
                assert pickle.load(f)["segments"]
        json.loads(hr.snapshot_json())

    def history():
        hr._record_memory_history("all", max_entries=1000)
        y = torch.empty(3 << 20, device="cuda", dtype=torch.uint8)
        del y
        tr = hr.snapshot()["device_traces"][0]
        assert any(e["action"] == "alloc" for e in tr), tr[:3]
        hr._record_memory_history(None)

    def record_stream():
        s = torch.cuda.Stream()
        x = torch.empty(4 << 20, device="cuda", dtype=torch.uint8)
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)
            x.fill_(1)
        hr.record_stream(x, s)
        ptr = x.data_ptr()
        del x
        y = torch.empty(4 << 20, device="cuda", dtype=torch.uint8)
        assert y.data_ptr() != ptr, "reused while the side stream ran"
        s.synchronize()

    def oom():
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "oom.pickle")
            hr.set_oom_snapshot(p)
            hr.last_oom_message(clear=True)
            free, _ = torch.cuda.mem_get_info()
            t = None
            try:
                # PyTorch does not check a pluggable allocator's pointer: it may hand back a
                # tensor over null (never touched here) or raise on its own.
                t = torch.empty(free + (1 << 30), device="cuda", dtype=torch.uint8)
            except RuntimeError:
                pass
            msg = hr.last_oom_message()
            assert msg and msg.startswith("CUDA out of memory. Tried to allocate"), msg
            assert os.path.exists(p), "no OOM snapshot"
            assert hr.memory_stats()["num_ooms"] >= 1
            try:
                hr.raise_if_oom()
                raise AssertionError("raise_if_oom did not raise")
            except torch.OutOfMemoryError:
                pass
            del t
            hr.set_oom_snapshot(None)
        z = torch.ones(1 << 20, device="cuda")
        assert float(z.sum()) == float(1 << 20)

    def empty():
        x = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
        del x
        r0 = hr.memory_reserved()
        hr.empty_cache()
        assert hr.memory_reserved() < r0

    for name, fn in [("routed", routed), ("stats_keys", stats_keys), ("summary", summary),
                     ("snapshot", snap), ("history", history), ("record_stream", record_stream),
                     ("oom_snapshot", oom), ("empty_cache", empty)]:
        check(name, fn)
    for name, ok, err in res:
        print("check %-14s %s %s" % (name, "ok" if ok else "FAILED", err), flush=True)
    npass = sum(1 for _, ok, _ in res if ok)
    print("vramroom_torch checks (%s): %d passed, %d failed" % (MODE, npass, len(res) - npass),
          flush=True)
    return npass, len(res) - npass


def main():
    torch.backends.cudnn.benchmark = False
    for wl in (wl_resnet_infer, wl_resnet_train, wl_gpt2_varlen, wl_gpt2_varlen_serve):
        if ONLY and wl.__name__[3:] not in ONLY and wl.__name__ not in ONLY:
            continue
        reset()
        recording = RECORD and hr is None
        if recording:
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None,
                                                     stacks="python")
        try:
            emit(wl())
        except Exception as e:  # noqa: BLE001
            emit(dict(workload=wl.__name__, error=repr(e)))
        if recording:
            import pickle

            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            name = wl.__name__[3:] + ("__expandable" if "expandable" in MODE else "")
            with open(os.path.join(RECORD, f"{name}.pickle"), "wb") as f:
                pickle.dump(snap, f)
    if ONLY:
        return
    reset()
    try:
        emit(dict(workload="python_pair_ns", ns=python_pair_ns()))
    except Exception as e:  # noqa: BLE001
        emit(dict(workload="python_pair_ns", error=repr(e)))
    if VRAMROOM:
        reset()
        p, f = checks()
        emit(dict(workload="checks", passed=p, failed=f))


if __name__ == "__main__":
    main()
