"""Speed of the tracer: python -m vramroom.trace.bench [gpt2|llama7b|all]

- gpt2: GPT-2 small (124M, transformers) training step, batch 8 x 512: forward, backward,
  AdamW (foreach) step. Model built under the trace with torch.device("cuda").
- llama7b: LlamaConfig(hidden 4096, 32 layers, intermediate 11008, vocab 32000), batch 1 x
  512: forward, backward, AdamW step, built under torch.device("cuda") (fake: no host memory).

Times exclude importing torch and transformers (done first); the peak RSS of the process is
printed at the end (ru_maxrss).
"""

import resource
import sys
import time


def _step(t_model, batch, seq, vocab):
    import torch

    opt = torch.optim.AdamW(t_model.parameters(), lr=1e-4)
    x = torch.randint(0, vocab, (batch, seq), device="cuda")
    out = t_model(x, labels=x)
    out.loss.backward()
    opt.step()
    opt.zero_grad()


def run(which):
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    import vramroom.trace as vt

    t0 = time.perf_counter()
    with vt.trace(gpu="h100") as t:
        if which == "gpt2":
            with torch.device("cuda"):
                m = GPT2LMHeadModel(GPT2Config())
            _step(m, 8, 512, 50257)
        else:
            cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008,
                              vocab_size=32000, num_attention_heads=32, num_key_value_heads=32)
            with torch.device("cuda"):
                m = LlamaForCausalLM(cfg)
            _step(m, 1, 512, 32000)
        del m
    dt = time.perf_counter() - t0
    print("%-8s traced in %6.2f s  (%d events, peak allocated %.2f GiB, sdpa %s)"
          % (which, dt, len(t.events), t.peak_allocated / 2**30, t.hidden_stats["sdpa"]), flush=True)
    return dt


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    which = argv[0] if argv else "all"
    for w in (["gpt2", "llama7b"] if which == "all" else [which]):
        run(w)
    print("peak RSS %.2f GB" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6))


if __name__ == "__main__":
    main()
