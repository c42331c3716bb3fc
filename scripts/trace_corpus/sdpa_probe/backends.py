"""What probe.py and hook.py ask of each SDPA backend: PyTorch's own can_use_* checks."""
import warnings

import torch


def ask(p, row, limit=200):
    """Each backend's can_use_*(params, debug=True) into row, with its reasons (the warnings
    it gives, each cut to `limit` characters)."""
    for name, fn in (("cudnn", torch.backends.cuda.can_use_cudnn_attention),
                     ("efficient", torch.backends.cuda.can_use_efficient_attention),
                     ("flash", torch.backends.cuda.can_use_flash_attention)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            row[name] = bool(fn(p, True))
        row[name + "_why"] = [str(x.message)[:limit] for x in w]
