"""What a TorchScript function allocates on the GPU, call by call: the profiling executor
runs the first calls op by op, then may fuse elementwise ops into one kernel (fewer
intermediates). The tracer runs such functions op by op on fake CUDA; this says when that
is what the GPU does. Prints one line per call: the sizes allocated inside it.

    python ops/jit_fusion.py"""
import torch


@torch.jit.script
def buckets(relative_pos, bucket_size: int, max_position: int):
    # transformers' DeBERTa-v2 make_log_bucket_position
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where((relative_pos < mid) & (relative_pos > -mid),
                          torch.tensor(mid - 1).type_as(relative_pos), torch.abs(relative_pos))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(
        torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos.type_as(log_pos), log_pos * sign)


def main():
    q = torch.arange(256, device="cuda")
    rel = q[:, None] - q[None, :]
    for i in range(6):
        torch.cuda.memory._record_memory_history(max_entries=100000)
        out = buckets(rel, 256, 512)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        sizes = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
        print("jit call %d: %d allocations %s" % (i + 1, len(sizes), sizes), flush=True)
        del out


if __name__ == "__main__":
    main()
