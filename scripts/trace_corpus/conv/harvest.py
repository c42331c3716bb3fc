"""The conv configs to measure: every aten.convolution that torchvision's common models run at
224x224 (batch 1, on meta), and those of the corpus programs (run on meta).

    python harvest.py convs.json
"""
import json, sys, torch, torchvision
from torch.utils._python_dispatch import TorchDispatchMode
seen = {}
class M(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.convolution.default:
            x, w, b = args[0], args[1], args[2]
            stride, padding, dilation, transposed, outpad, groups = args[3:9]
            key = (tuple(x.shape[1:]), tuple(w.shape), b is not None, tuple(stride), tuple(padding), tuple(dilation), bool(transposed), tuple(outpad), groups)
            seen.setdefault(key, set()).add(self.model)
        return func(*args, **kwargs)
models = ["resnet18","resnet34","resnet50","resnet101","resnext50_32x4d","wide_resnet50_2","mobilenet_v2","mobilenet_v3_small","mobilenet_v3_large","efficientnet_b0","efficientnet_b1","efficientnet_v2_s","vgg11","vgg16","densenet121","convnext_tiny","regnet_y_400mf","regnet_x_800mf","shufflenet_v2_x1_0","squeezenet1_0","squeezenet1_1","googlenet","alexnet","mnasnet1_0","vit_b_16","swin_t"]
m = M()
for name in models:
    kw = {"aux_logits": False, "init_weights": False} if name in ("googlenet",) else {}
    net = getattr(torchvision.models, name)(weights=None, **kw).to("meta")
    for res in ([224] if name not in ("inception_v3",) else [299]):
        m.model = name
        with torch.no_grad(), m:
            net(torch.empty(1, 3, res, res, device="meta"))
# The corpus programs' own convs (a custom CNN, ...): each run on meta, small.
import glob, os, runpy
os.environ["CORPUS_DEVICE"] = "meta"
for prog in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "programs", "*.py"))):
    src = open(prog).read()
    if "conv" not in src.lower() and "torchvision" not in src:
        continue
    m.model = os.path.basename(prog)[:-3]
    saved = sys.argv
    sys.argv = [prog, "--steps", "1"]
    try:
        with m:
            runpy.run_path(prog, run_name="__main__")
    except BaseException as e:  # a program that needs CUDA itself: its shapes come from the models above
        print("skipped", m.model, type(e).__name__, str(e)[:100], file=sys.stderr)
    finally:
        sys.argv = saved
print(len(seen), file=sys.stderr)
out = [dict(input=list(k[0]), weight=list(k[1]), bias=k[2], stride=list(k[3]), padding=list(k[4]), dilation=list(k[5]), transposed=k[6], output_padding=list(k[7]), groups=k[8], models=sorted(v)) for k, v in seen.items()]
json.dump(out, open(sys.argv[1], "w"))
