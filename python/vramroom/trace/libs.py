"""Libraries that look for fake tensors and take another path under them.

transformers (5.x) treats a FakeTensor as "tracing" (`utils.import_utils.is_tracing`), and
then, among others, always builds the 4-d attention mask instead of passing `is_causal` to
SDPA (`masking_utils._ignore_causal_mask_sdpa`). A real CUDA run skips the mask, so the
traced program would allocate masks the GPU never sees, and SDPA would pick another
backend. Under the tracer the program is not being traced in transformers' sense (it runs
eagerly, only without data), so `is_fake_tensor` answers False for the trace's duration.

The module may be imported by the user's script after the trace starts: then a meta-path
finder patches it as it loads (importing transformers up front would cost a second to
programs that never use it).
"""

import importlib.abc
import sys

_TARGET = "transformers.utils.import_utils"


def _not_fake(x):
    return False


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
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
    def __init__(self):
        self._saved = []
        self._finder = None

    def patch(self, module):
        if getattr(module, "is_fake_tensor", None) is not None and \
                not any(m is module for m, _ in self._saved):
            self._saved.append((module, module.is_fake_tensor))
            module.is_fake_tensor = _not_fake

    def install(self):
        mod = sys.modules.get(_TARGET)
        if mod is not None:
            self.patch(mod)
        else:
            self._finder = _Finder(self)
            sys.meta_path.insert(0, self._finder)
        return self

    def uninstall(self):
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        for module, old in reversed(self._saved):
            module.is_fake_tensor = old
        self._saved.clear()
