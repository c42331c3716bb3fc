"""Lazy modules (nn.LazyLinear, nn.LazyConv2d, ...) under the trace.

An UninitializedParameter is a tensor subclass made on a plain tensor (`_make_subclass`),
which a fake tensor cannot be; and `.cuda()` keeps it uninitialized only by swapping its data
in place (`param.data = ...`), which a real tensor cannot take from a fake one. So while a
trace runs:

- an uninitialized parameter or buffer is made on a real, empty CPU tensor (no memory on any
  device, as on the GPU, where it holds 0 elements), and remembers the device and dtype it
  was asked for;
- `Module._apply` (`.cuda()`, `.to()`, `.half()`) leaves such tensors out and records
  where the conversion would send them, found by applying it to an empty fake tensor;
- at the first forward, `materialize` makes the real parameter as a fake tensor there and
  puts it in its module's place (the module being inferred: `_infer_parameters`), so the
  allocation happens where PyTorch's does, before the module's reset_parameters().
"""

import threading

_state = threading.local()


def _target(t):
    return getattr(t, "_vramroom_target", None) or (None, None)


class LazySupport:
    _saved = []

    @classmethod
    def install(cls):
        import torch
        from torch.nn import Module, parameter
        from torch.nn.modules.lazy import LazyModuleMixin
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        if cls._saved:
            return
        mixin = parameter.UninitializedTensorMixin

        def save(obj, name, value):
            cls._saved.append((obj, name, obj.__dict__[name]))
            setattr(obj, name, value)

        def new_param(k, requires_grad=True, device=None, dtype=None):
            if device is None:
                device = torch.get_default_device()  # torch.set_default_device("cuda")
            with unset_fake_temporarily():
                data = torch.empty(0, dtype=dtype, device="cpu")
            t = torch.Tensor._make_subclass(k, data, requires_grad)
            t._vramroom_target = (torch.device(device), dtype)
            return t

        def new_buffer(k, requires_grad=False, device=None, dtype=None, persistent=True):
            t = new_param(k, requires_grad, device, dtype)
            t.persistent = persistent
            return t

        save(parameter.UninitializedParameter, "__new__", staticmethod(new_param))
        save(parameter.UninitializedBuffer, "__new__", staticmethod(new_buffer))

        orig_apply = Module._apply

        def _apply(self, fn, recurse=True):
            lazy = {}
            for kind in ("_parameters", "_buffers"):
                d = self.__dict__.get(kind) or {}
                for name, t in list(d.items()):
                    if isinstance(t, mixin):
                        lazy[(kind, name)] = t
                        del d[name]
            if lazy:
                device, dtype = _target(next(iter(lazy.values())))
                probe = fn(torch.empty(0, device=device or "cpu", dtype=dtype or torch.float32))
                for t in lazy.values():
                    t._vramroom_target = (probe.device, probe.dtype)
            try:
                return orig_apply(self, fn, recurse)
            finally:
                for (kind, name), t in lazy.items():
                    getattr(self, kind)[name] = t

        save(Module, "_apply", _apply)

        orig_infer = LazyModuleMixin._infer_parameters

        def _infer_parameters(self, module, args, kwargs=None):
            prev = getattr(_state, "module", None)
            _state.module = module
            try:
                return orig_infer(self, module, args, kwargs)
            finally:
                _state.module = prev

        save(LazyModuleMixin, "_infer_parameters", _infer_parameters)

        def materialize(self, shape, device=None, dtype=None):
            module = getattr(_state, "module", None)
            want_dev, want_dtype = _target(self)
            new = torch.empty(shape, device=device or want_dev or "cpu",
                              dtype=dtype or want_dtype or self.dtype)
            for kind in ("_parameters", "_buffers"):
                d = getattr(module, kind, None) or {}
                for name, t in d.items():
                    if t is self:
                        d[name] = torch.nn.Parameter(new, self.requires_grad) \
                            if kind == "_parameters" else new
                        return
            from .capture import UnsupportedOp

            raise UnsupportedOp("materialize", "a lazy parameter materialized outside its "
                                "module's first forward cannot be faked")

        save(mixin, "materialize", materialize)

    @classmethod
    def uninstall(cls):
        while cls._saved:
            obj, name, orig = cls._saved.pop()
            setattr(obj, name, orig)
