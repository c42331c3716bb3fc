"""A variable-length BERT-base encoder service: each request is a batch of 1-48 sequences of
16-512 tokens (its body says which), one forward under no_grad. See common.py."""
import common


def load():
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        return transformers.BertModel(transformers.BertConfig()).eval()


def handle(model, body, probe):
    import torch

    b = max(1, min(int(body.get("batch", 1)), 256))
    n = max(8, min(int(body.get("length", 128)), 512))
    with probe.request(items=b, tokens=b * n), torch.no_grad():
        ids = torch.randint(0, 30522, (b, n), device="cuda")
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        v = out.last_hidden_state[:, 0].float().norm().item()
        del out, ids
    return {"batch": b, "length": n, "v": v}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
