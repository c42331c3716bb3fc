//! `memory_summary()`: byte-identical to PyTorch 2.11.
