"""Conv configs a program runs that the measured table lacks: the program is traced on fake
CUDA (vramroom.trace, H100) and every conv whose shape conv_events_sm90.json does not hold is
written in convs.json's format, for measure.py.

    PYTHONPATH=python python harvest_prog.py OUT.json PROGRAM.py [PROGRAM.py ...]
        [--channels-last | --channels-last-input | --beyond]

--channels-last: instead, the 2-d convs that run channels_last whose channels_last events the
table lacks (it falls back to the NCHW ones), for measure.py --channels-last;
--channels-last-input: those with an NHWC input and an NCHW weight (measure.py
--channels-last-input);
--beyond: instead, the convs the table holds only at batches smaller than the program's (their
events extrapolated), each with "batches": the ones the program runs, which measure.py
measures for that config in place of --batches.
"""
import json
import os
import runpy
import sys

import vramroom
from vramroom.trace import hidden

cl_only = "--channels-last" in sys.argv
cl_input = "--channels-last-input" in sys.argv
beyond = "--beyond" in sys.argv
out, progs = sys.argv[1], [p for p in sys.argv[2:] if not p.startswith("--")]
seen, order = {}, []
orig = hidden.Hidden.conv_tokens


def logged(self, pas, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    toks = orig(self, pas, x, w, bias, stride, padding, dilation, transposed, output_padding,
                groups)
    if cl_only or cl_input:
        import torch

        def is_cl(t):
            return t.dim() == 4 and not t.is_contiguous() and \
                t.is_contiguous(memory_format=torch.channels_last)

        cl = is_cl(x) and (not is_cl(w) if cl_input else True)
        key = (pas, tuple(x.shape[1:]), tuple(w.shape), bool(bias), tuple(stride),
               tuple(padding), tuple(dilation), bool(transposed), tuple(output_padding),
               int(groups), str(x.dtype).split(".")[-1],
               "channels_last_input" if cl_input else "channels_last")
        missing = cl and key not in self.conv_ev
    elif beyond:
        # measured, but only at smaller batches: extrapolated (a double backward's
        # transposed conv, whose batch is the channels)
        missing = False
        if x.dim() >= 3:
            import torch

            cl = [t.dim() == 4 and not t.is_contiguous()
                  and t.is_contiguous(memory_format=torch.channels_last) for t in (x, w)]
            key = (pas, tuple(x.shape[1:]), tuple(w.shape), bool(bias), tuple(stride),
                   tuple(padding), tuple(dilation), bool(transposed), tuple(output_padding),
                   int(groups), str(x.dtype).split(".")[-1])
            pts = self._conv_points(key, cl)
            if not pts and pas in ("backward_input_only", "backward_weight_only"):
                pts = self._conv_points(("backward",) + key[1:], cl)
            missing = bool(pts) and x.shape[0] > pts[-1][0]
    else:
        missing = toks is None and x.dim() >= 3
    if missing:
        c = dict(input=list(x.shape[1:]), weight=list(w.shape), bias=bool(bias),
                 stride=list(stride), padding=list(padding), dilation=list(dilation),
                 transposed=bool(transposed), output_padding=list(output_padding),
                 groups=int(groups))
        k = json.dumps(c, sort_keys=True)
        if k not in seen:
            seen[k] = c
            c["models"] = []
            c["rank"] = len(order)
            order.append(k)
        name = os.path.basename(prog)
        if name not in seen[k]["models"]:
            seen[k]["models"].append(name)
        if beyond and int(x.shape[0]) not in seen[k].setdefault("batches", []):
            seen[k]["batches"] = sorted(seen[k]["batches"] + [int(x.shape[0])])
    return toks


hidden.Hidden.conv_tokens = logged
for prog in progs:
    sys.argv = [prog]
    try:
        with vramroom.trace(gpu="h100"):
            runpy.run_path(prog, run_name="__main__")
    except Exception as e:  # a refused program: its convs up to the refusal still count
        print("%s: %s" % (os.path.basename(prog), str(e)[:120]))
json.dump([seen[k] for k in order], open(out, "w"), indent=1)
print("%d conv configs not in the table, from %d programs" % (len(order), len(progs)))
