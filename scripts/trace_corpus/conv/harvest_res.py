"""More conv configs to measure: torchvision's common models at resolutions other than 224
(CIFAR's 32, 64, 128, ..., 512), minus those already in convs.json, most-used first.

    python harvest_res.py convs.json convs_res.json
"""
import json
import sys

import torch
import torchvision
from torch.utils._python_dispatch import TorchDispatchMode

RES = [32, 128, 256, 64, 384, 512, 160, 192, 299, 320, 448, 96]
MODELS = ["resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "resnet34", "mobilenet_v3_large",
          "convnext_tiny", "resnet101", "densenet121", "vgg16", "regnet_y_400mf", "mobilenet_v3_small",
          "efficientnet_b1", "resnext50_32x4d", "wide_resnet50_2", "shufflenet_v2_x1_0"]
have = {json.dumps({k: c[k] for k in ("input", "weight", "bias", "stride", "padding", "dilation",
                                      "transposed", "output_padding", "groups")}, sort_keys=True)
        for c in json.load(open(sys.argv[1]))}
seen = {}
order = []


class M(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            x, w, b = args[0], args[1], args[2]
            stride, padding, dilation, transposed, outpad, groups = args[3:9]
            c = dict(input=list(x.shape[1:]), weight=list(w.shape), bias=b is not None,
                     stride=list(stride), padding=list(padding), dilation=list(dilation),
                     transposed=bool(transposed), output_padding=list(outpad), groups=groups)
            k = json.dumps(c, sort_keys=True)
            if k not in have:
                if k not in seen:
                    seen[k] = c
                    c["models"] = []
                    c["rank"] = self.rank
                    order.append(k)
                seen[k]["models"].append("%s@%d" % (self.name, self.res))
        return func(*args, **(kwargs or {}))


m = M()
for ri, res in enumerate(RES):
    for mi, name in enumerate(MODELS):
        net = getattr(torchvision.models, name)(weights=None).to("meta")
        m.name, m.res, m.rank = name, res, ri * 100 + mi
        try:
            with torch.no_grad(), m:
                net(torch.empty(1, 3, res, res, device="meta"))
        except Exception as e:  # a model that does not take this size
            print("skipped", name, res, type(e).__name__, file=sys.stderr)
out = [seen[k] for k in order]
out.sort(key=lambda c: c.pop("rank"))
for c in out:
    c["models"] = sorted(set(c["models"]))
json.dump(out, open(sys.argv[2], "w"))
print(len(out), file=sys.stderr)
