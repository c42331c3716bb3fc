"""What PyTorch allocates for Hugging Face transformers models, as users run them (GPU).

    python3 scripts/hf_memory.py OUT_DIR [--models gpt2,llama-small,...] [--dev cuda|cpu]

For every config under fixtures/hf/ (or those named), in a fresh process each, the scenarios
Vramroom's `predict --model PATH` predicts: a forward pass without grad with and without
`use_cache`, `generate()` (greedy, prefill then decode) with the dynamic and the static cache,
and AdamW training steps. Each scenario starts from an emptied cache with the weights resident
and reset peaks, and writes one JSON line to OUT_DIR/hf_memory.jsonl: the weights' bytes
(`base_allocated`), PyTorch's peak allocated and reserved, and the versions. Its memory history
(no stacks) goes to OUT_DIR/hf_snaps/<model>__<scenario>.pickle, so a prediction can be matched
allocation by allocation. `--dev cpu` runs the same code without CUDA, as a smoke test.
"""
import argparse
import gc
import json
import os
import pickle
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "fixtures", "hf")

CAUSAL_SHAPES = {
    "gpt2": [(1, 128), (8, 512), (32, 1024)],
    "gpt2-tiny": [(2, 32)],
    "llama-tiny": [(2, 64)],
    "llama-small": [(1, 128), (4, 512), (8, 1024)],
    "mistral-tiny": [(2, 64), (4, 256)],
    "qwen2-tiny": [(2, 64), (4, 256)],
}
GENERATE = {  # (batch, prompt, new)
    "gpt2": [(1, 128, 64), (8, 256, 32)],
    "gpt2-tiny": [(2, 16, 8)],
    "llama-tiny": [(2, 16, 8)],
    "llama-small": [(1, 128, 64), (8, 256, 32)],
    "mistral-tiny": [(2, 32, 16)],
    "qwen2-tiny": [(2, 32, 16)],
}
TRAIN = {
    "gpt2": [(8, 512)],
    "gpt2-tiny": [(2, 32)],
    "llama-tiny": [(2, 64)],
    "llama-small": [(4, 512)],
    "mistral-tiny": [(4, 128)],
    "qwen2-tiny": [(4, 128)],
    "bert-base": [(8, 512)],
    "bert-tiny": [(2, 32)],
}
BERT_INFER = {"bert-base": [(8, 512), (32, 128)], "bert-tiny": [(2, 32)]}


def scenarios(name, family):
    out = []
    dtypes = ["float32", "bfloat16"]
    if family == "bert":
        for dt in dtypes:
            for b, s in BERT_INFER[name]:
                out.append(dict(kind="forward", dtype=dt, batch=b, seq=s, use_cache=None))
    else:
        for dt in dtypes:
            for b, s in CAUSAL_SHAPES[name]:
                for uc in (True, False):
                    out.append(dict(kind="forward", dtype=dt, batch=b, seq=s, use_cache=uc))
        for b, p, n in GENERATE[name]:
            for impl in ("dynamic", "static"):
                out.append(dict(kind="generate", dtype="float32", batch=b, prompt=p, new=n,
                                cache=impl))
        b, p, n = GENERATE[name][0]
        out.append(dict(kind="generate", dtype="bfloat16", batch=b, prompt=p, new=n,
                        cache="dynamic"))
    for b, s in TRAIN[name]:
        out.append(dict(kind="train", dtype="float32", batch=b, seq=s, steps=3))
    return out


def sid(sc):
    keys = ["kind", "dtype", "batch", "seq", "prompt", "new", "use_cache", "cache"]
    return "_".join(f"{sc[k]}" for k in keys if sc.get(k) is not None)


def run_model(name, out, dev):
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    cfg = tf.AutoConfig.from_pretrained(os.path.join(FIX, name))
    family = cfg.model_type
    cuda = dev == "cuda"
    snaps = os.path.join(out, "hf_snaps")
    os.makedirs(snaps, exist_ok=True)
    lines = []
    for sc in scenarios(name, "bert" if family == "bert" else "causal"):
        dt = getattr(torch, sc["dtype"])
        torch.manual_seed(0)
        if family == "bert":
            cls = tf.BertForMaskedLM if sc["kind"] == "train" else tf.BertModel
        else:
            cls = tf.AutoModelForCausalLM
        model = (cls.from_config(cfg) if cls is tf.AutoModelForCausalLM else cls(cfg))
        model = model.to(device=dev, dtype=dt)
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(context=None, clear_history=True)
        else:
            base = 0
        t0 = time.time()
        vocab = cfg.vocab_size
        if sc["kind"] == "forward":
            model.eval()
            ids = torch.randint(0, vocab, (sc["batch"], sc["seq"]), device=dev)
            with torch.no_grad():
                if family == "bert":
                    o = model(input_ids=ids, attention_mask=torch.ones_like(ids))
                else:
                    o = model(input_ids=ids, use_cache=sc["use_cache"])
            del o
        elif sc["kind"] == "generate":
            model.eval()
            ids = torch.randint(0, vocab, (sc["batch"], sc["prompt"]), device=dev)
            kw = dict(max_new_tokens=sc["new"], min_new_tokens=sc["new"], do_sample=False,
                      pad_token_id=0)
            if sc["cache"] == "static":
                # transformers compiles the forward of a static cache on its own; the memory
                # of an inductor graph is not the eager model's, so compare eager with eager
                kw["cache_implementation"] = "static"
                kw["disable_compile"] = True
            with torch.no_grad():
                g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
            assert g.shape[1] == sc["prompt"] + sc["new"], g.shape
            del g
        else:
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            for _ in range(sc["steps"]):
                ids = torch.randint(0, vocab, (sc["batch"], sc["seq"]), device=dev)
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            del opt, loss
        if cuda:
            torch.cuda.synchronize()
        rec = dict(model=name, family=family, **sc, ms=round((time.time() - t0) * 1e3, 2),
                   base_allocated=base, torch=torch.__version__, transformers=tf.__version__,
                   attn_implementation=getattr(model.config, "_attn_implementation", None))
        if cuda:
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            path = os.path.join(snaps, f"{name}__{sid(sc)}.pickle")
            with open(path, "wb") as f:
                pickle.dump(snap, f)
            rec.update(peak_allocated=torch.cuda.max_memory_allocated(),
                       peak_reserved=torch.cuda.max_memory_reserved(),
                       end_allocated=torch.cuda.memory_allocated(),
                       snapshot=os.path.basename(path))
        print(json.dumps(rec), flush=True)
        lines.append(rec)
        del model
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--models", default="")
    ap.add_argument("--dev", default="cuda")
    ap.add_argument("--one", default="")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.one:
        run_model(a.one, a.out, a.dev)
        return
    names = [m for m in a.models.split(",") if m] or sorted(os.listdir(FIX))
    procs = []
    for n in names:
        log = open(os.path.join(a.out, f"hf_{n}.log"), "w")
        procs.append((n, log, subprocess.Popen(
            [sys.executable, __file__, a.out, "--one", n, "--dev", a.dev],
            stdout=subprocess.PIPE, stderr=log, text=True)))
    with open(os.path.join(a.out, "hf_memory.jsonl"), "a") as f:
        for n, log, p in procs:
            so, _ = p.communicate(timeout=900)
            f.write(so)
            print(f"{n}: exit {p.returncode}, {len(so.splitlines())} scenarios", flush=True)


if __name__ == "__main__":
    main()
