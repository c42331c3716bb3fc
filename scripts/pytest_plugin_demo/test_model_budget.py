"""The vramroom pytest plugin on a real model, on a real GPU: one test within its CUDA memory
budget, one over it (that one is meant to fail, leaving a snapshot of its allocations).

Run by run_gpu.sh on the GPU machine; see README.md beside this file.
"""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def resnet18():
    """torchvision's ResNet-18 (random weights: no download); when torchvision is absent,
    a small conv net of the same shape of work."""
    try:
        import torchvision

        return torchvision.models.resnet18(), "torchvision resnet18"
    except ImportError:
        import torch.nn as nn

        layers, c = [nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU()], 64
        for out in (64, 128, 256, 512):
            layers += [nn.Conv2d(c, out, 3, 2 if out != 64 else 1, 1), nn.BatchNorm2d(out),
                       nn.ReLU(), nn.Conv2d(out, out, 3, 1, 1), nn.BatchNorm2d(out), nn.ReLU()]
            c = out
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
        return nn.Sequential(*layers), "conv net (torchvision not installed)"


@pytest.fixture
def model():
    m, name = resnet18()
    print("model:", name)
    return m.cuda()


@pytest.mark.max_cuda_memory("1GiB")
def test_inference_batch_8_fits_in_1GiB(model, cuda_memory):
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(8, 3, 224, 224, device="cuda"))
    assert out.shape == (8, 1000)
    print("peak allocated %.1f MiB" % (cuda_memory.peak_allocated / 2**20))


@pytest.mark.max_cuda_memory("1GiB")
def test_training_batch_128_is_over_1GiB(model, cuda_memory):
    # Meant to fail: a training step keeps every activation for the backward.
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(128, 3, 224, 224, device="cuda")
    loss = model(x).float().logsumexp(1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print("peak allocated %.1f MiB" % (cuda_memory.peak_allocated / 2**20))
