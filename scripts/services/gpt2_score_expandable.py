"""A scoring service under expandable segments: GPT-2 (random weights) computes each text's
log-likelihood (a full forward, fp32 logits over the 50257-token vocabulary, log_softmax,
gather): a batch of 1-4 texts of 32-512 tokens. Its requests' large logits come and go in
every size, the load that expandable segments are for, so the service sets
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True itself before torch loads (unless the
environment already says otherwise, as a deployment would). See common.py."""
import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import common  # noqa: E402


def load():
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        return transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()


def handle(model, body, probe):
    import torch

    b = max(1, min(int(body.get("batch", 1)), 16))
    n = max(8, min(int(body.get("length", 128)), 1024))
    with probe.request(items=b, tokens=b * n), torch.no_grad():
        ids = torch.randint(0, 50257, (b, n), device="cuda")
        logits = model(input_ids=ids).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).sum()
        v = float(lp.item())
        del logits, lp, ids
    return {"batch": b, "length": n, "logprob": v}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
