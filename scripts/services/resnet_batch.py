"""An image-classification service with batching: ResNet-50 (torchvision, random weights),
each request a batch of 1-64 images of 224x224 sent as a count (the service makes the
tensor), top-1 per image under no_grad. See common.py."""
import common


def load():
    import torch
    import torchvision

    with torch.device("cuda"):  # initialised on the GPU: a restart takes seconds
        return torchvision.models.resnet50().eval()


def handle(model, body, probe):
    import torch

    b = max(1, min(int(body.get("images", 1)), 256))
    with probe.request(items=b), torch.no_grad():
        x = torch.randn(b, 3, 224, 224, device="cuda")
        top = model(x).argmax(1)
        first = int(top[0].item())
        del x, top
    return {"images": b, "top1": first}


if __name__ == "__main__":
    common.serve(common.args(), load, handle)
