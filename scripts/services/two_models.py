"""Two models on one GPU: a text encoder (a 4-layer BERT, hidden 512, fp16) and an image
model (ResNet-18, fp16), both random weights. Each request brings a batch of 1-16 captions
of 16-256 tokens and 1-32 images of 224x224 and runs both, under one probe tag carrying its
tokens and its images. See common.py."""
import common


def load():
    import torch
    import torchvision
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        text = transformers.BertModel(transformers.BertConfig(
            hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048))
        vision = torchvision.models.resnet18()
    return text.to(torch.float16).eval(), vision.to(torch.float16).eval()


def handle(models, body, probe):
    import torch

    text, vision = models
    b = max(1, min(int(body.get("batch", 1)), 64))
    n = max(8, min(int(body.get("length", 64)), 512))
    k = max(1, min(int(body.get("images", 1)), 128))
    with probe.request(items=k, tokens=b * n), torch.no_grad():
        ids = torch.randint(0, 30522, (b, n), device="cuda")
        t = text(input_ids=ids).last_hidden_state[:, 0]
        x = torch.randn(k, 3, 224, 224, device="cuda", dtype=torch.float16)
        v = vision(x)
        score = float((t.float().mean() + v.float().mean()).item())
        del ids, t, x, v
    return {"batch": b, "length": n, "images": k, "score": score}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
