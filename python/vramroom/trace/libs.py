"""Libraries that look for fake tensors, or at token values, and take another path under them.

transformers (5.x) treats a FakeTensor as "tracing" (`utils.import_utils.is_tracing`), and
then, among others, always builds the 4-d attention mask instead of passing `is_causal` to
SDPA (`masking_utils._ignore_causal_mask_sdpa`). A real CUDA run skips the mask, so the
traced program would allocate masks the GPU never sees, and SDPA would pick another
backend. Under the tracer the program is not being traced in transformers' sense (it runs
eagerly, only without data), so `is_fake_tensor` answers False for the trace's duration.

generate() stops on token values the fake run does not have. values.py answers the checks
built from uniform tensors (max length, unfinished flags); two more are presumed, each with
a warning in the report, both the way that generates the most tokens (the memory worst case,
and what a run with `min_new_tokens` does):
- `EosTokenCriteria`: no sequence has just produced an EOS token. Greedy and sampling then
  run to `max_new_tokens` (an unknown flag already read as False there); beam search, whose
  loop reads "has unfinished sequences", needs the flag known.
- beam search's early-stop heuristic (`_check_early_stop_heuristic`): while no beam has
  finished, the worst finished score is transformers' -1e9 placeholder, which any finite
  running score beats, so the heuristic keeps its input's value. With a finished beam it
  compares real scores: left unknown.
- the attention mask generate() infers when none is given
  (`_prepare_attention_mask_for_generation`): it is the prompt's `!= pad_token_id` where the
  prompt holds a pad token, else ones; with the token values unknown, ones (no pad token in
  the prompt: a padded batch comes with its tokenizer's attention mask). Left unknown, every
  mask check after it (masking_utils' `fast_all`) would read False, and the program would
  build the 4-d masks and take the SDPA kernels that a real run without padding skips.
The tensors are still computed by the fake kernels (their allocations are the GPU's); only
their value is set.

`save_pretrained` of a fake model writes nothing, as torch.save does under the trace (api.py).

The modules may be imported by the user's script after the trace starts: then a meta-path
finder patches each as it loads (importing transformers up front would cost a second to
programs that never use it).
"""

import importlib.abc
import inspect
import sys

EOS_PRESUMED = ("generate(): a fake sequence's EOS check presumed False (no sequence ends "
                "before max_new_tokens: the memory worst case)")
MASK_PRESUMED = ("generate(): the attention mask it infers from the prompt presumed ones (no "
                 "pad token in a fake prompt; pass attention_mask for a padded batch)")
BEAMS_PRESUMED = ("generate(): beam search's early-stop heuristic presumed unmet while no beam "
                  "has finished (finite scores beat the -1e9 placeholder)")


_ABSENT = object()


def _not_fake(x):
    return False


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches.patchers:
            return None
        for f in sys.meta_path:
            if f is self:
                continue
            spec = f.find_spec(name, path, target) if hasattr(f, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                loader, patches = spec.loader, self.patches
                orig_exec = loader.exec_module

                def exec_module(module, orig_exec=orig_exec):
                    orig_exec(module)
                    patches.patch(module)

                loader.exec_module = exec_module
                return spec
        return None


class LibraryPatches:
    def __init__(self, values=None, warn=None):
        self._saved = []  # (object, attribute, old value)
        self._finder = None
        self.values = values
        self.warn = warn or (lambda msg: None)
        self.patchers = {"transformers.utils.import_utils": self._patch_import_utils,
                         "transformers.modeling_utils": self._patch_modeling_utils}
        if values is not None:
            self.patchers["transformers.generation.stopping_criteria"] = self._patch_stopping
            self.patchers["transformers.generation.utils"] = self._patch_generation

    def patch(self, module):
        p = self.patchers.get(module.__name__)
        if p is not None:
            p(module)

    def _set(self, obj, name, value):
        if any(o is obj and n == name for o, n, _ in self._saved):
            return
        # a class's own attribute (a staticmethod stays one); absent: inherited, deleted after
        old = obj.__dict__.get(name, _ABSENT) if isinstance(obj, type) else getattr(obj, name)
        self._saved.append((obj, name, old))
        setattr(obj, name, value)

    def _patch_import_utils(self, module):
        if getattr(module, "is_fake_tensor", None) is not None:
            self._set(module, "is_fake_tensor", _not_fake)

    def _patch_modeling_utils(self, module):
        # save_pretrained of a fake model: nothing written (torch.save's rule, api.py), and
        # its shared-tensor check, which compares data pointers, would fail anyway
        from torch._subclasses.fake_tensor import FakeTensor

        cls = getattr(module, "PreTrainedModel", None)
        orig = getattr(cls, "save_pretrained", None)
        if orig is None:
            return
        warn = self.warn

        def save_pretrained(model, *args, **kwargs):
            if any(isinstance(p, FakeTensor) for p in model.parameters()):
                warn("save_pretrained() of a fake model not written (a fake run has no data)")
                return None
            return orig(model, *args, **kwargs)

        self._set(cls, "save_pretrained", save_pretrained)

    def _patch_stopping(self, module):
        cls = getattr(module, "EosTokenCriteria", None)
        if cls is None:
            return
        self._set(cls, "__call__",
                  self.values.presuming(cls.__call__, False, self.warn, EOS_PRESUMED))

    def _patch_generation(self, module):
        from torch._subclasses.fake_tensor import FakeTensor

        cls = getattr(module, "GenerationMixin", None)
        sm = getattr(cls, "__dict__", {}).get("_check_early_stop_heuristic")
        if not isinstance(sm, staticmethod):
            return
        fn, vals, warn = sm.__func__, self.values, self.warn
        sig = inspect.signature(fn)

        def heuristic(*args, **kwargs):
            out = fn(*args, **kwargs)
            if isinstance(out, FakeTensor) and vals.known(out) is None:
                a = sig.bind(*args, **kwargs).arguments
                finished = vals.known(a.get("is_sent_finished"))
                unmet = vals.known(a.get("is_early_stop_heuristic_unsatisfied"))
                if finished is not None and not finished and unmet is not None:
                    vals.presume(out, unmet)
                    warn(BEAMS_PRESUMED)
            return out

        self._set(cls, "_check_early_stop_heuristic", staticmethod(heuristic))

        infer = cls.__dict__.get("_prepare_attention_mask_for_generation")
        if infer is not None:
            self._set(cls, "_prepare_attention_mask_for_generation",
                      vals.presuming(infer, 1, warn, MASK_PRESUMED))

    def install(self):
        missing = False
        for name in self.patchers:
            mod = sys.modules.get(name)
            if mod is not None:
                self.patch(mod)
            else:
                missing = True
        if missing:
            self._finder = _Finder(self)
            sys.meta_path.insert(0, self._finder)
        return self

    def uninstall(self):
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for obj, name, old in reversed(self._saved):
            if old is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self._saved.clear()
