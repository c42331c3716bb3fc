"""Evidence for the diagnosis of a traced program: what each allocation is, and where in the
user's code it was made (#30 Deliver 3).

The recorder (capture.py) writes every storage allocation and free in program order. This
module watches the same run from the outside and leaves marks between those events; it
never changes what the program allocates or keeps alive:
- saved for backward: a `torch.autograd.graph.saved_tensors_hooks` pack hook tags the
  storage of every tensor autograd saves, and the unpack hook tells which of them a backward
  used. The hook's holder dies with the saved variable (after the backward consumed it, or
  with its graph), which ends the tag. A saved tensor never unpacked was saved for a
  backward that never ran.
- parameters and buffers: those of each outermost module call (a global forward pre-hook),
  and of each optimizer step; gradients: their `.grad` after each backward and step;
  optimizer state: `optimizer.state` after each step (a global step post-hook).
- backward calls (`torch.autograd.backward` / `grad`, so `loss.backward()` too) with the
  user's line, and the line that made the tensor backward was called on.
- forward passes: outermost module calls, with the user's line that called the model.
- iteration boundaries: optimizer steps, else backward calls, else forward passes.

Categories are decided for an allocation's whole life from what was learnt by the end
(a parameter is a parameter from its allocation on). Everything else is "activation"
(outputs, losses, temporaries), less what autograd holds for a backward at the time.

The decisions (which finding, how severe, its wording) are the Rust engine's
(crates/vramroom-load/src/diagnose/traced.rs): this file only measures. `evidence()`
returns the JSON-able dict that `vramroom replay SNAPSHOT --evidence FILE` reads.
"""

import contextlib
import os
import sys
import sysconfig
import weakref

VERSION = 1
# Sites listed per boundary (the rest are summed in the totals).
TOP_SITES = 16

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIB_DIRS = tuple(
    p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p
)


def _user_file(fn, _cache={}):
    """Is `fn` the user's code (not torch's, a library's, the stdlib's or ours)?"""
    r = _cache.get(fn)
    if r is None:
        r = fn in ("<string>", "<stdin>") or fn.startswith("<ipython-input") or not (
            fn.startswith("<")
            or "site-packages" in fn
            or "dist-packages" in fn
            or fn.startswith(_PKG)
            or any(fn.startswith(d) for d in _LIB_DIRS)
            or "/torch/" in fn
        )
        _cache[fn] = r
    return r


def _user_frame_of(frames):
    for f in frames:
        if _user_file(f[0]):
            return f
    return None


def _stack_user_frame():
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if _user_file(fn):
            return (fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _called_by_user():
    """Was the module called directly by the user's code (not by a library's loop, such as
    `generate()`'s decoding steps)? The first frame outside torch and this package decides."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not ("/torch/" in fn or fn.startswith(_PKG)):
            return _user_file(fn)
        f = f.f_back
    return False


# Autograd nodes of arithmetic on losses: `total + loss / n`, `(a + b) / 2`.
_ARITH = frozenset(("AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "DivBackward0",
                    "DivBackward1", "MulBackward0", "MulBackward1", "NegBackward0"))


def _grad_fns(out, acc, depth=0):
    """grad_fn of the tensors in a module's output (tensors, tuples, dicts, ModelOutput)."""
    import torch

    if isinstance(out, torch.Tensor):
        if out.grad_fn is not None:
            acc.append(out.grad_fn)
    elif depth < 3:
        if isinstance(out, dict):
            out = list(out.values())
        if isinstance(out, (tuple, list)):
            for o in out[:64]:
                _grad_fns(o, acc, depth + 1)
    return acc


def _summands(root, limit=256):
    """Sequence numbers of the terms the tensor backward runs on sums (through +, -, *, /):
    each micro-step's loss when losses were summed; one term otherwise."""
    fn = getattr(root, "grad_fn", None)
    if fn is None:
        return []
    # Nodes' Python wrappers are made on access: keep them alive so that ids stay unique.
    out, stack, seen = [], [fn], {}
    while stack and len(seen) < limit:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen[id(n)] = n
        if type(n).__name__ in _ARITH:
            stack.extend(m for m, _ in n.next_functions if m is not None)
        elif type(n).__name__ != "AccumulateGrad":
            out.append(n._sequence_nr())
    return out


class _Saved:
    """What autograd keeps for a saved tensor: the tensor itself, and our tag."""

    __slots__ = ("t", "addr", "col", "__weakref__")

    def __init__(self, t, addr, col):
        self.t = t
        self.addr = addr
        self.col = col

    def __del__(self):
        col = self.col
        if col is not None:
            col._mark("unsave", self.addr)


class Collector:
    def __init__(self, rec):
        self.rec = rec
        self.marks = []  # (event position, kind, data)
        self.static = {}  # addr -> parameter | gradient | optimizer_state
        self.used = set()  # addrs a backward unpacked
        self.params = {}  # id -> weakref of parameters seen
        self.pass_end_seq = []  # autograd sequence number at each outermost pass's end
        self._depth = 0
        self._handles = []
        self._saved_cm = None
        self._patched = []
        self._evidence = None
        self.active = False
        self.saved_hooks = False

    # ---- marks ----------------------------------------------------------------------
    def _mark(self, kind, data=None):
        self.marks.append((len(self.rec.events), kind, data))

    def _addr(self, t):
        try:
            e = self.rec.live.get(t.untyped_storage()._cdata)
        except Exception:
            return None
        return e.addr if e is not None and e.size > 0 else None

    def _tag(self, t, cat):
        if t is None:
            return
        a = self._addr(t)
        if a is not None and a not in self.static:
            self.static[a] = cat

    def _see_params(self, params):
        for p in params:
            if p is None:
                continue
            self._tag(p, "parameter")
            if id(p) not in self.params:
                try:
                    self.params[id(p)] = weakref.ref(p)
                except TypeError:
                    pass

    def _see_grads(self):
        for r in list(self.params.values()):
            p = r()
            if p is not None and getattr(p, "grad", None) is not None:
                self._tag(p.grad, "gradient")

    # ---- hooks ----------------------------------------------------------------------
    def install(self):
        import torch
        import torch.autograd as autograd
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_mod

        col = self

        def pack(t):
            if not col.active:
                return t
            a = col._addr(t)
            if a is None:
                return t
            col._mark("save", a)
            return _Saved(t, a, col)

        def unpack(s):
            if isinstance(s, _Saved):
                col.used.add(s.addr)
                return s.t
            return s

        cm = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        try:
            cm.__enter__()
            self._saved_cm = cm
            self.saved_hooks = True
        except RuntimeError:
            # Saved-tensor hooks disabled (torch.func): no saved-for-backward evidence, so
            # neither autograd_in_inference nor graph_accumulated can be found.
            self._saved_cm = None

        def pre(module, args):
            if col._depth == 0 and col.active:
                col._see_params(module.parameters())
                for b in module.buffers():
                    col._tag(b, "parameter")
                col._mark("fwd", (_stack_user_frame(), type(module).__name__, _called_by_user()))
            col._depth += 1

        def post(module, args, out):
            col._depth = max(0, col._depth - 1)
            if col._depth == 0 and col.active:
                fns = _grad_fns(out, [])
                if fns:
                    col.pass_end_seq.append(max(f._sequence_nr() for f in fns))
                col._mark("fwd_end")

        self._handles.append(nn_module.register_module_forward_pre_hook(pre))
        self._handles.append(nn_module.register_module_forward_hook(post))

        def step_post(opt, args, kwargs):
            if not col.active:
                return
            for g in opt.param_groups:
                col._see_params(g["params"])
                for p in g["params"]:
                    col._tag(getattr(p, "grad", None), "gradient")
            for st in opt.state.values():
                if isinstance(st, dict):
                    for v in st.values():
                        if isinstance(v, torch.Tensor):
                            col._tag(v, "optimizer_state")
            col._mark("step", _stack_user_frame())

        self._handles.append(optim_mod.register_optimizer_step_post_hook(step_post))

        def wrap(name, orig):
            def backward(tensors, *a, **k):
                if not col.active:
                    return orig(tensors, *a, **k)
                root = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
                col._depth = 0
                # Summed losses: terms made in different forward passes' windows (a loss
                # made during or after pass k, before pass k+1 began).
                import bisect

                ends = sorted(col.pass_end_seq)
                terms = _summands(root) if isinstance(root, torch.Tensor) else []
                summed = len({bisect.bisect_left(ends, q) for q in terms}) if len(terms) > 1 else len(terms)
                col._mark("bwd", (_stack_user_frame(), col._addr(root) if isinstance(root, torch.Tensor) else None,
                                  summed))
                try:
                    return orig(tensors, *a, **k)
                finally:
                    col._see_grads()
                    col._mark("bwd_end")

            backward.__wrapped__ = orig
            backward.__name__ = name
            return backward

        # torch.func's grad/vjp/jacrev run under disable_saved_tensors_hooks, which raises
        # when any default hooks are installed: ours step aside for that region (no
        # saved-for-backward evidence inside a functorch transform), as if never installed
        graph = autograd.graph
        orig_disable = graph.disable_saved_tensors_hooks

        @contextlib.contextmanager
        def disable_saved_tensors_hooks(error_message):
            ours = col._saved_cm is not None and \
                torch._C._autograd._top_saved_tensors_default_hooks(True) == (pack, unpack)
            if ours:
                torch._C._autograd._pop_saved_tensors_default_hooks()
            try:
                with orig_disable(error_message):
                    yield
            finally:
                if ours:
                    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)

        self._patched.append((graph, "disable_saved_tensors_hooks", orig_disable))
        graph.disable_saved_tensors_hooks = disable_saved_tensors_hooks
        for name in ("backward", "grad"):
            orig = getattr(autograd, name)
            self._patched.append((autograd, name, orig))
            setattr(autograd, name, wrap(name, orig))
        self.active = True
        return self

    def uninstall(self):
        if not self.active and self._saved_cm is None:
            return
        self.active = False
        for h in self._handles:
            h.remove()
        self._handles = []
        for obj, name, orig in reversed(self._patched):
            setattr(obj, name, orig)
        self._patched = []
        if self._saved_cm is not None:
            try:
                self._saved_cm.__exit__(None, None, None)
            finally:
                self._saved_cm = None

    # ---- the evidence ---------------------------------------------------------------
    def evidence(self):
        if self._evidence is None:
            self._evidence = _build(self)
        return self._evidence


def _round(n):
    return 512 if n <= 512 else (n + 511) // 512 * 512


CATS = ("parameter", "gradient", "optimizer_state", "saved_for_backward", "activation")


def _build(col):
    events = col.rec.events
    marks = col.marks
    static = col.static
    used = col.used

    site_ids = {}
    sites = []

    def sid(fr):
        if fr is None:
            return None
        k = (fr[0], fr[1])
        i = site_ids.get(k)
        if i is None:
            i = site_ids[k] = len(sites)
            sites.append({"file": fr[0], "line": fr[1], "function": fr[2]})
        return i

    frame_site = {}

    def alloc_site(frames):
        k = id(frames)
        r = frame_site.get(k)
        if r is None:
            r = frame_site[k] = (sid(_user_frame_of(frames)), frames)
        return r[0]

    cats = dict.fromkeys(CATS, 0)
    no_bwd = 0  # saved bytes never unpacked (held for a backward that never runs)
    live = {}  # addr -> [size, site, static cat or None, pass]
    cnt = {}  # addr -> saved count
    site_live = {}  # site -> bytes of non-static allocations (less those no_bwd holds)
    pass_live = {}  # pass index -> saved bytes it holds
    nob_site = {}  # pass-or-alloc site -> no_bwd bytes
    saved_pass = {}  # addr -> pass index when first saved
    allocated = 0
    peak = {"event": 0, "allocated_bytes": 0, "categories": dict(cats)}
    nob_max = {"bytes": 0, "event": 0, "sites": {}}
    forwards = []  # [start, end, site, module]
    cur_pass = None  # index into forwards while a pass runs
    last_pass = None
    backwards = []
    bounds = {"step": [], "bwd_end": [], "fwd": []}
    empties = []
    pass_sites = {}

    def snap(ev):
        top = sorted(((b, s) for s, b in site_live.items() if b > 0 and s is not None), reverse=True)[:TOP_SITES]
        return {
            "event": ev,
            "allocated_bytes": allocated,
            "categories": dict(cats),
            "saved_no_backward_bytes": no_bwd,
            "sites": {str(s): b for b, s in top},
        }

    def do_mark(pos, kind, data):
        nonlocal cur_pass, last_pass, no_bwd
        if kind == "save":
            a = data
            e = live.get(a)
            if e is None:
                return
            c = cnt.get(a, 0)
            cnt[a] = c + 1
            if c == 0 and e[2] is None:
                cats["activation"] -= e[0]
                cats["saved_for_backward"] += e[0]
                p = last_pass if cur_pass is None else cur_pass
                saved_pass.setdefault(a, p)
                e[3] = saved_pass[a]
                if e[3] is not None:
                    pass_live[e[3]] = pass_live.get(e[3], 0) + e[0]
                if a not in used_final:
                    no_bwd += e[0]
                    site_live[e[1]] = site_live.get(e[1], 0) - e[0]
                    s = pass_sites.get(e[3], e[1])
                    nob_site[s] = nob_site.get(s, 0) + e[0]
                    if no_bwd > nob_max["bytes"]:
                        nob_max.update(bytes=no_bwd, event=pos, sites=dict(nob_site))
        elif kind == "unsave":
            a = data
            e = live.get(a)
            c = cnt.get(a, 0)
            if c <= 0:
                return
            cnt[a] = c - 1
            if c == 1 and e is not None and e[2] is None:
                _unsave(a, e)
        elif kind == "fwd":
            fr, mod, direct = data
            forwards.append([pos, None, sid(fr), mod])
            cur_pass = last_pass = len(forwards) - 1
            pass_sites[cur_pass] = forwards[-1][2]
            if direct:
                # An iteration of the user's own loop (a library's loop is one call).
                bounds["fwd"].append(snap(pos))
        elif kind == "fwd_end":
            if cur_pass is not None:
                forwards[cur_pass][1] = pos
            cur_pass = None
        elif kind == "bwd":
            fr, root, summed = data
            cur_pass = None
            groups = {}
            for p, b in pass_live.items():
                if b <= 0 or p is None:
                    continue
                g = groups.setdefault(forwards[p][2], [0, 0, 0])
                g[0] += 1
                g[1] += b
                g[2] = max(g[2], b)
            root_site = None
            if root is not None and root in live:
                root_site = live[root][1]
            backwards.append({
                "event": pos,
                "site": sid(fr),
                "root_site": root_site,
                "saved_bytes": cats["saved_for_backward"],
                "summed_losses": summed,
                "allocated_bytes": allocated,
                "passes": [
                    {"site": s, "count": g[0], "bytes": g[1], "max_pass_bytes": g[2]}
                    for s, g in sorted(groups.items(), key=lambda kv: -kv[1][1])
                ],
            })
        elif kind == "bwd_end":
            if backwards:
                backwards[-1]["end_event"] = pos
            bounds["bwd_end"].append(snap(pos))
        elif kind == "step":
            b = snap(pos)
            b["site"] = sid(data)
            bounds["step"].append(b)

    def _unsave(a, e):
        nonlocal no_bwd
        cats["saved_for_backward"] -= e[0]
        cats["activation"] += e[0]
        if e[3] is not None:
            pass_live[e[3]] = pass_live.get(e[3], 0) - e[0]
        if a not in used_final:
            no_bwd -= e[0]
            site_live[e[1]] = site_live.get(e[1], 0) + e[0]
            s = pass_sites.get(e[3], e[1])
            nob_site[s] = nob_site.get(s, 0) - e[0]

    used_final = used
    mi = 0
    nm = len(marks)
    for i, (action, addr, size, stream, frames) in enumerate(events):
        while mi < nm and marks[mi][0] <= i:
            do_mark(*marks[mi])
            mi += 1
        if action == "alloc":
            n = _round(size)
            st = static.get(addr)
            site = pass_sites.get(cur_pass) if cur_pass is not None else None
            if site is None:
                site = alloc_site(frames)
            live[addr] = [n, site, st, None]
            allocated += n
            if st is not None:
                cats[st] += n
            else:
                cats["activation"] += n
                site_live[site] = site_live.get(site, 0) + n
            if allocated > peak["allocated_bytes"]:
                peak = {"event": i, "allocated_bytes": allocated, "categories": dict(cats),
                        "saved_no_backward_bytes": no_bwd}
        elif action == "free_requested":
            e = live.pop(addr, None)
            if e is None:
                continue
            if cnt.get(addr, 0) > 0 and e[2] is None:
                _unsave(addr, e)
                cnt[addr] = 0
            allocated -= e[0]
            if e[2] is not None:
                cats[e[2]] -= e[0]
            else:
                cats["activation"] -= e[0]
                site_live[e[1]] = site_live.get(e[1], 0) - e[0]
        elif action == "empty_cache":
            empties.append({"event": i, "site": alloc_site(frames)})
    while mi < nm:
        do_mark(*marks[mi])
        mi += 1

    if bounds["step"]:
        kind, bl = "optimizer_step", bounds["step"]
    elif bounds["bwd_end"]:
        kind, bl = "backward", bounds["bwd_end"]
    else:
        kind, bl = "forward", bounds["fwd"]
    fsites = {}
    for f in forwards:
        fsites[f[2]] = fsites.get(f[2], 0) + 1
    return {
        "version": VERSION,
        "saved_hooks": col.saved_hooks,
        "events": len(events),
        "sites": sites,
        "allocated_peak": peak,
        "baseline_bytes": peak["categories"]["parameter"],
        "forwards": [[f[0], f[1] if f[1] is not None else len(events), f[2]] for f in forwards],
        "forward_sites": [{"site": s, "count": c} for s, c in sorted(fsites.items(), key=lambda kv: -kv[1]) if s is not None],
        "backwards": backwards,
        "saved_no_backward": {
            "max_bytes": nob_max["bytes"],
            "event": nob_max["event"],
            "sites": [{"site": s, "bytes": b} for s, b in sorted(nob_max["sites"].items(), key=lambda kv: -kv[1]) if b > 0 and s is not None],
        },
        "boundary_kind": kind,
        "boundaries": bl,
        "empty_cache": empties,
    }


def site_text(ev, i):
    """`file:line` of site `i` of an evidence dict."""
    if i is None:
        return "?"
    s = ev["sites"][i]
    return "%s:%d" % (s["file"], s["line"])


def write(ev, path):
    import json

    with open(path, "w") as f:
        json.dump({"evidence": ev}, f)
    return path


def print_findings(findings, out):
    """The diagnosis after the report's table: one line per finding with the user's
    file:line, then its evidence and fix."""
    if not findings:
        print("findings: none (no mistake of the seed's found)", file=out)
        return
    print("findings:", file=out)
    for f in findings:
        print("  %-8s %s at %s: %s" % (f["severity"], f["id"], f["location"], f["title"]), file=out)
        print("      %s" % f["evidence"], file=out)
        print("      fix: %s" % f["fix"], file=out)
