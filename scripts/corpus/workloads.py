"""The workloads of the real-snapshot corpus (issue "real snapshots").

Each workload is a function `name(dev)` that runs on `dev` ("cuda", or "cpu" for a smoke test of
the ones that need no CUDA feature) and returns nothing. Seeds are fixed, so that a workload run
twice in one process layout asks the allocator for the same sizes in the same order. The ones
marked `NONDETERMINISTIC` interleave threads or processes: their own trace replays exactly, but
a trace of one config cannot predict another config's run byte for byte.

`record.py` calls one of them with memory history on; `record_all.py` runs every one under each
allocator config.
"""
import math
import os
import random
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

NONDETERMINISTIC = {"multithread_infer", "ddp_gloo_2rank"}
NEEDS_CUDA = {
    "graph_manual_resnet18",
    "graph_shared_pool",
    "graph_release",
    "compile_reduce_overhead",
    "side_stream_record_stream",
    "side_stream_prefetch",
    "oom_recover",
    "ddp_gloo_2rank",
}


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _hf():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


# ---------------------------------------------------------------- torchvision


def tv_resnet18_infer_varbatch(dev):
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet18().to(dev).eval()
    with torch.no_grad():
        for bs in [1, 8, 32, 3, 17, 48, 5, 64, 1]:
            m(torch.randn(bs, 3, 224, 224, device=dev))
    _sync(dev)


def tv_mobilenet_v3_train(dev):
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.mobilenet_v3_small().to(dev).train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    for _ in range(4):
        x = torch.randn(32, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (32,), device=dev)
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(dev)


def tv_vit_b16_infer_amp(dev):
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.vit_b_16().to(dev).eval()
    dt = torch.bfloat16
    with torch.no_grad(), torch.autocast(dev, dtype=dt):
        for bs in [4, 16, 1, 9]:
            m(torch.randn(bs, 3, 224, 224, device=dev))
    _sync(dev)


# --------------------------------------------------------------- transformers


def hf_bert_varlen_infer(dev):
    tf = _hf()
    torch.manual_seed(0)
    m = tf.BertModel(tf.BertConfig()).to(dev).eval()
    rng = random.Random(0)
    with torch.no_grad():
        for _ in range(40):
            bs = rng.choice([1, 2, 4, 8, 16, 32])
            n = rng.randint(16, 512)
            ids = torch.randint(0, 30522, (bs, n), device=dev)
            mask = torch.ones(bs, n, dtype=torch.long, device=dev)
            m(input_ids=ids, attention_mask=mask)
    _sync(dev)


def hf_gpt2_generate(dev):
    tf = _hf()
    torch.manual_seed(0)
    m = tf.GPT2LMHeadModel(tf.GPT2Config()).to(dev).eval()
    ids = torch.randint(0, 50257, (4, 64), device=dev)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, do_sample=False,
                   pad_token_id=0, min_new_tokens=32)
    _sync(dev)


def hf_llama_train_amp(dev):
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=1024)
    m = tf.LlamaForCausalLM(cfg).to(dev).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(4):
        ids = torch.randint(0, 32000, (4, 256), device=dev)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(dev)


def hf_llama_generate(dev):
    tf = _hf()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=6, num_attention_heads=16, num_key_value_heads=4,
                         max_position_embeddings=2048)
    m = tf.LlamaForCausalLM(cfg).to(dev, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for bs, n in [(2, 100), (8, 37)]:
            ids = torch.randint(0, 32000, (bs, n), device=dev)
            m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                       min_new_tokens=24, do_sample=False, pad_token_id=0)
    _sync(dev)


# ----------------------------------------------------------------- CUDA graphs


def _resnet18(dev):
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18().to(dev).eval()


def graph_manual_resnet18(dev):
    """ResNet-18 inference captured with torch.cuda.graph, replayed beside eager batches."""
    m = _resnet18(dev)
    static_in = torch.randn(8, 3, 224, 224, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            m(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_out = m(static_in)
    with torch.no_grad():
        for i, bs in enumerate([8, 3, 8, 32, 8, 1]):
            x = torch.randn(bs, 3, 224, 224, device=dev)
            if bs == 8:
                static_in.copy_(x)
                g.replay()
                static_out.clone()
            else:
                m(x)
    torch.cuda.synchronize()


def graph_shared_pool(dev):
    """Two graphs of one MLP (batch 8 and 32) sharing one private pool; one is released."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev).eval()
    pool = torch.cuda.graph_pool_handle()
    graphs, ins, outs = [], [], []
    s = torch.cuda.Stream()
    for bs in [32, 8]:  # largest first, as the docs advise for a shared pool
        x = torch.randn(bs, 1024, device=dev)
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            m(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            y = m(x)
        graphs.append(g)
        ins.append(x)
        outs.append(y)
    with torch.no_grad():
        for _ in range(3):
            for g in graphs:
                g.replay()
        for bs in [16, 64, 4]:
            m(torch.randn(bs, 1024, device=dev))
    torch.cuda.synchronize()
    del graphs[0], ins[0], outs[0]
    torch.cuda.empty_cache()
    with torch.no_grad():
        for bs in [128, 2]:
            m(torch.randn(bs, 1024, device=dev))
        graphs[0].replay()
    torch.cuda.synchronize()
    del graphs, ins, outs, g, x, y
    torch.cuda.empty_cache()
    with torch.no_grad():
        m(torch.randn(64, 1024, device=dev))
    torch.cuda.synchronize()


def graph_release(dev):
    """A graph captured, replayed, released; empty_cache returns its pool; eager goes on."""
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)]).to(dev).eval()
    x = torch.randn(64, 2048, device=dev)
    with torch.no_grad():
        m(x)  # warm-up on the default stream
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        y = m(x)
        tmp = torch.randn(300, 2048, device=dev)  # freed inside the capture
        del tmp
    for _ in range(4):
        g.replay()
    with torch.no_grad():
        m(torch.randn(256, 2048, device=dev))
    torch.cuda.synchronize()
    del g, y
    torch.cuda.empty_cache()
    with torch.no_grad():
        for bs in [64, 512, 8]:
            m(torch.randn(bs, 2048, device=dev))
    torch.cuda.synchronize()


def compile_reduce_overhead(dev):
    """torch.compile(mode="reduce-overhead"): cudagraph trees, two input shapes."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512), nn.LayerNorm(512))
    m = m.to(dev).eval()
    cm = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for bs in [16, 16, 16, 64, 64, 64, 16, 64]:
            out = cm(torch.randn(bs, 512, device=dev))
            out = out.clone()
    torch.cuda.synchronize()


# --------------------------------------------------------------- side streams


def side_stream_record_stream(dev):
    """Tensors made on a side stream, used on the main stream, with record_stream."""
    torch.manual_seed(0)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    w = torch.randn(2048, 2048, device=dev)
    keep = []
    for i in range(12):
        with torch.cuda.stream(side):
            a = torch.randn(512 + 64 * i, 2048, device=dev)
            b = a @ w
        main.wait_stream(side)
        b.record_stream(main)
        c = torch.relu(b) @ w
        del a, b  # freed while main may still read b
        keep.append(c.sum())
        if i % 4 == 3:
            keep.clear()
    torch.cuda.synchronize()
    # a tensor of the main stream handed to the side stream
    x = torch.randn(4096, 1024, device=dev)
    with torch.cuda.stream(side):
        side.wait_stream(main)
        x.record_stream(side)
        y = x * 2
    del x
    z = torch.randn(4096, 1024, device=dev)
    del y, z
    torch.cuda.synchronize()


def side_stream_prefetch(dev):
    """Pinned batches copied on a copy stream, consumed by a model on the default stream."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10)).to(dev).eval()
    copy = torch.cuda.Stream()
    host = [torch.randn(bs, 1024).pin_memory() for bs in [64, 128, 32, 256, 64, 512, 16, 128]]
    nxt = None
    with torch.no_grad():
        for i in range(len(host) + 1):
            cur = nxt
            if i < len(host):
                with torch.cuda.stream(copy):
                    nxt = host[i].to(dev, non_blocking=True)
            if cur is not None:
                torch.cuda.current_stream().wait_stream(copy)
                cur.record_stream(torch.cuda.current_stream())
                m(cur).argmax(1)
                del cur
    torch.cuda.synchronize()


# ------------------------------------------------------------------- threads


def multithread_infer(dev):
    """Four threads serving an MLP at once (NONDETERMINISTIC interleaving)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev).eval()

    def worker(k):
        rng = random.Random(k)
        with torch.no_grad():
            for _ in range(20):
                m(torch.randn(rng.choice([1, 8, 64, 256]), 1024, device=dev))

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    _sync(dev)


# ---------------------------------------------------------------- training etc.


def mlp_train_accum(dev):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                      nn.Linear(4096, 10)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for step in range(3):
        for _ in range(4):
            x = torch.randn(256, 1024, device=dev)
            y = torch.randint(0, 10, (256,), device=dev)
            (F.cross_entropy(m(x), y) / 4).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(dev)


def churn_random_sizes(dev):
    """Random sizes allocated and freed out of order (fragmentation), an empty_cache midway."""
    rng = random.Random(0)
    live = []
    for i in range(600):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live)))
        else:
            n = int(math.exp(rng.uniform(math.log(256), math.log(64 << 20))))
            live.append(torch.empty(n, dtype=torch.uint8, device=dev))
        if i == 300:
            del live[::2]
            if dev == "cuda":
                torch.cuda.empty_cache()
    del live
    _sync(dev)


def empty_cache_loop(dev):
    """Inference with empty_cache() after every batch, as many services do."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768)).to(dev).eval()
    with torch.no_grad():
        for bs in [7, 128, 33, 512, 1, 256]:
            m(torch.randn(bs, 197, 768, device=dev)).mean().item()
            if dev == "cuda":
                torch.cuda.empty_cache()
    _sync(dev)


def oom_recover(dev):
    """Grows a batch under a memory fraction until CUDA runs out, catches it, and backs off."""
    torch.cuda.set_per_process_memory_fraction(0.02)  # about 2.8 GiB of an H200
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 8192), nn.GELU(), nn.Linear(8192, 1024)).to(dev).eval()
    bs, ooms = 256, 0
    with torch.no_grad():
        while ooms < 2 and bs < (1 << 20):
            try:
                m(torch.randn(bs, 1024, device=dev)).sum().item()
                bs *= 2
            except torch.OutOfMemoryError:
                ooms += 1
                bs //= 3
        m(torch.randn(bs, 1024, device=dev)).sum().item()
    torch.cuda.synchronize()


def ddp_gloo_2rank(dev):
    """Placeholder: record.py runs this one as two processes (see record_ddp in record.py)."""
    raise RuntimeError("ddp_gloo_2rank is run by record.py --ddp")


def ddp_rank_body(dev, rank, world):
    """One rank of a 2-rank DDP job (gloo, both ranks on cuda:0), uneven batches per rank."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(dev)
    ddp = DDP(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    bs = 64 if rank == 0 else 256  # rank 1 carries the larger shard: an imbalance to see
    for _ in range(3):
        x = torch.randn(bs, 1024, device=dev)
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    _sync(dev)


ALL = [
    "tv_resnet18_infer_varbatch",
    "tv_mobilenet_v3_train",
    "tv_vit_b16_infer_amp",
    "hf_bert_varlen_infer",
    "hf_gpt2_generate",
    "hf_llama_train_amp",
    "hf_llama_generate",
    "graph_manual_resnet18",
    "graph_shared_pool",
    "graph_release",
    "compile_reduce_overhead",
    "side_stream_record_stream",
    "side_stream_prefetch",
    "multithread_infer",
    "mlp_train_accum",
    "churn_random_sizes",
    "empty_cache_loop",
    "oom_recover",
    "ddp_gloo_2rank",
]
