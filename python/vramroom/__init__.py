"""Vramroom: PyTorch GPU memory made visible, predictable and survivable.

    import vramroom
    r = vramroom.replay("snap.pickle", alloc_conf="expandable_segments:True", capacity="24GiB")
    r["peak_reserved_bytes"], r["num_ooms"]
    vramroom.min_capacity("snap.pickle")            # bytes; as capacity= it never OOMs
    vramroom.recommend("snap.pickle")["recommended"]
    print(vramroom.summary("snap.pickle"))          # torch.cuda.memory_summary()'s table
    vramroom.predict("gpt2", batch=8, seq=512)      # meta device, no GPU
    vramroom.diff("base.pickle", "new.pickle")

Also: `vramroom.probe` (the in-service probe), `vramroom.torch` (Vramroom's allocator inside
PyTorch), the pytest plugin (`@pytest.mark.max_cuda_memory("2GiB")`), and the `vramroom`
command.

Design note: the functions come from the `vramroom._native` extension (crates/vramroom-py),
built on the same Rust crates as the CLI. Importing the package must stay cheap and must not
need the extension: `python -m vramroom.probe` and `vramroom.torch` run from a source checkout
(PYTHONPATH=python) too, so the API is loaded on first use and says how to build it when
missing.
"""

_API = ("replay", "min_capacity", "recommend", "summary", "predict", "diff", "parse_size")

__all__ = list(_API) + ["__version__"]


def __getattr__(name):
    if name == "trace":  # the fake-CUDA tracer; imports torch only when a trace runs
        import importlib

        return importlib.import_module("vramroom.trace")
    if name in _API or name == "__version__":
        try:
            from vramroom import _native
        except ImportError as e:
            raise ImportError(
                "vramroom.%s needs the compiled extension vramroom._native, which this copy "
                "of the package lacks (a source checkout?): pip install the vramroom wheel, "
                "or build one with scripts/build_wheel.sh (%s)" % (name, e)
            ) from e
        value = getattr(_native, name)
        globals()[name] = value
        return value
    raise AttributeError("module 'vramroom' has no attribute %r" % name)
