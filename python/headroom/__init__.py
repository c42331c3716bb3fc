"""Headroom: PyTorch GPU memory made visible, predictable and survivable.

    import headroom
    r = headroom.replay("snap.pickle", alloc_conf="expandable_segments:True", capacity="24GiB")
    r["peak_reserved_bytes"], r["num_ooms"]
    headroom.min_capacity("snap.pickle")            # bytes; as capacity= it never OOMs
    headroom.recommend("snap.pickle")["recommended"]
    print(headroom.summary("snap.pickle"))          # torch.cuda.memory_summary()'s table
    headroom.predict("gpt2", batch=8, seq=512)      # meta device, no GPU
    headroom.diff("base.pickle", "new.pickle")

Also: `headroom.probe` (the in-service probe), `headroom.torch` (Headroom's allocator inside
PyTorch), the pytest plugin (`@pytest.mark.max_cuda_memory("2GiB")`), and the `headroom`
command.

Design note: the functions come from the `headroom._native` extension (crates/headroom-py),
built on the same Rust crates as the CLI. Importing the package must stay cheap and must not
need the extension: `python -m headroom.probe` and `headroom.torch` run from a source checkout
(PYTHONPATH=python) too, so the API is loaded on first use and says how to build it when
missing.
"""

_API = ("replay", "min_capacity", "recommend", "summary", "predict", "diff", "parse_size")

__all__ = list(_API) + ["__version__"]


def __getattr__(name):
    if name in _API or name == "__version__":
        try:
            from headroom import _native
        except ImportError as e:
            raise ImportError(
                "headroom.%s needs the compiled extension headroom._native, which this copy "
                "of the package lacks (a source checkout?): pip install the headroom wheel, "
                "or build one with scripts/build_wheel.sh (%s)" % (name, e)
            ) from e
        value = getattr(_native, name)
        globals()[name] = value
        return value
    raise AttributeError("module 'headroom' has no attribute %r" % name)
