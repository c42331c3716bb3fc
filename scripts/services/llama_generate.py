"""A Llama-family generate() service: a small LlamaForCausalLM from a LlamaConfig (8 layers,
hidden 1024, grouped-query attention: 16 heads, 4 KV heads; RoPE, SwiGLU; 155M parameters,
random weights, bf16) with
its KV cache (DynamicCache), greedy. Body: batch of prompts, prompt length, new tokens.
See common.py."""
import common


def load():
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        return transformers.LlamaForCausalLM(cfg).to(dtype=torch.bfloat16).eval()


def handle(model, body, probe):
    import torch

    b = max(1, min(int(body.get("batch", 1)), 32))
    n = max(8, min(int(body.get("prompt", 64)), 1536))
    new = max(1, min(int(body.get("new", 32)), 256))
    with probe.request(items=b, tokens=b * (n + new)), torch.no_grad():
        ids = torch.randint(0, 32000, (b, n), device="cuda")
        g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=0)
        last = int(g[0, -1].item())
        del g, ids
    return {"batch": b, "prompt": n, "new": new, "last": last}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
