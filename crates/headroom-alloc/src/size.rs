//! Byte sizes: PyTorch's `format_size` and a parser for `80GiB`, `1.5GB`, `4096`.
