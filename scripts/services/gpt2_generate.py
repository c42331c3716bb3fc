"""A causal-LM generate() service: GPT-2 (124M, random weights) with its KV cache (transformers'
DynamicCache), greedy. The body says the batch of prompts, the prompt length and the new tokens;
run d sends short outputs (8-32 new tokens) to one instance and long outputs (64-128, on
prompts of 64-512) to another. See common.py."""
import common


def load():
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        return transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()


def handle(model, body, probe):
    import torch

    b = max(1, min(int(body.get("batch", 1)), 32))
    n = max(8, min(int(body.get("prompt", 64)), 768))
    new = max(1, min(int(body.get("new", 32)), 256))
    with probe.request(items=b, tokens=b * (n + new)), torch.no_grad():
        ids = torch.randint(0, 50257, (b, n), device="cuda")
        g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
        last = int(g[0, -1].item())
        del g, ids
    return {"batch": b, "prompt": n, "new": new, "last": last}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
