"""The GPUs a trace can target: what `torch.cuda.get_device_properties` answers under the
tracer, and which architecture's row of `cuda_hidden.json` (the hidden allocations) applies.

Total memory is what `cudaMemGetInfo` reports on the card (the default `--capacity` of the
replay); `arch` names the row of the hidden-allocation table.
"""

from dataclasses import dataclass

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    arch: str  # row of cuda_hidden.json

    @property
    def capability(self):
        return (self.major, self.minor)

    @property
    def max_threads_per_sm(self):
        # cudaDevAttrMaxThreadsPerMultiProcessor: 1536 on sm86/sm89, 2048 on sm80/sm90
        return 1536 if (self.major, self.minor) in ((8, 6), (8, 7), (8, 9)) else 2048


GPUS = {
    "h100": Gpu("h100", "NVIDIA H100 80GB HBM3", 85024899072, 9, 0, 132, "sm90"),
    "h200": Gpu("h200", "NVIDIA H200", 150110011392, 9, 0, 132, "sm90"),
    "a100": Gpu("a100", "NVIDIA A100-SXM4-80GB", 85097971712, 8, 0, 108, "sm80"),
    "a100-40gb": Gpu("a100-40gb", "NVIDIA A100-SXM4-40GB", 42505273344, 8, 0, 108, "sm80"),
    "l4": Gpu("l4", "NVIDIA L4", 23580639232, 8, 9, 58, "sm89"),
}

DEFAULT_GPU = "h100"


def get_gpu(key):
    if isinstance(key, Gpu):
        return key
    k = (key or DEFAULT_GPU).lower().replace("_", "-")
    if k not in GPUS:
        raise ValueError(
            "unknown --gpu %r: known GPUs are %s" % (key, ", ".join(sorted(GPUS)))
        )
    return GPUS[k]
