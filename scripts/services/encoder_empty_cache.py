"""An encoder service that empties PyTorch's cache after every request (as many services do
"to give memory back"): a 6-layer BERT (random weights) over a batch of 1-32 sequences of
16-512 tokens, then torch.cuda.empty_cache(). See common.py."""
import common


def load():
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        return transformers.BertModel(transformers.BertConfig(num_hidden_layers=6)).eval()


def handle(model, body, probe):
    import torch

    b = max(1, min(int(body.get("batch", 1)), 256))
    n = max(8, min(int(body.get("length", 128)), 512))
    with probe.request(items=b, tokens=b * n), torch.no_grad():
        ids = torch.randint(0, 30522, (b, n), device="cuda")
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        v = out.last_hidden_state[:, 0].float().norm().item()
        del out, ids
    torch.cuda.empty_cache()
    return {"batch": b, "length": n, "v": v}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
