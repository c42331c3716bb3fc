# Types of the vramroom API (the functions come from the vramroom._native extension; see
# __init__.py). Results are the CLI's `--json` objects as plain dicts.
from os import PathLike
from typing import Any, Dict, List, Optional, Sequence, Union

from . import trace as trace

Trace = Union[str, bytes, "PathLike[str]"]  # a snapshot path (a .csv path is an RMM log) or its bytes
Size = Union[int, str]  # bytes, or a size string such as "24GiB"

__version__: str

def replay(trace: Trace, alloc_conf: Optional[str] = None, capacity: Optional[Size] = None,
           min_capacity: bool = False) -> Dict[str, Any]: ...
def min_capacity(trace: Trace, alloc_conf: Optional[str] = None) -> int: ...
def recommend(trace: Trace, alloc_confs: Optional[Sequence[str]] = None,
              capacity: Optional[Size] = None) -> Dict[str, Any]: ...
def summary(trace: Trace, alloc_conf: Optional[str] = None, capacity: Optional[Size] = None,
            abbreviated: bool = False) -> str: ...
def predict(model: Optional[str] = None, batch: Optional[int] = None,
            seq: Optional[Union[int, str]] = None, mode: Optional[str] = None, grad: bool = False,
            optimizer: Optional[str] = None, accum: Optional[int] = None,
            accum_pattern: Optional[str] = None, dtype: Optional[str] = None,
            seed: Optional[int] = None, new: Optional[int] = None, cache: Optional[str] = None,
            use_cache: Optional[bool] = None, steps: Optional[int] = None,
            alloc_conf: Optional[str] = None, capacity: Optional[Size] = None,
            find_max_batch: bool = False) -> Dict[str, Any]: ...
# The same keys as `vramroom diff --json` (one serialization in the Rust library).
def diff(base: Trace, new: Trace, top: int = 10) -> Dict[str, Any]: ...
def parse_size(text: str) -> int: ...
