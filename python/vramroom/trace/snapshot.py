"""A trace as a PyTorch-format memory snapshot (`torch.cuda.memory._snapshot()`'s dict).

The keys mirror a real 2.11 snapshot, so pytorch.org/memory_viz opens it and `vramroom
replay/diff/recommend` read it: `segments` is empty (the trace starts from an empty
allocator), `device_traces[0]` holds the client's requests in program order (`alloc`,
`free_requested`, `free_completed`; a `record_stream` free completes later), and
`allocator_settings` is the default config. A `torch.cuda.empty_cache()` call is written as
a one-entry release run (`segment_free` of address 0, size 0): the replay re-issues every
full release run of an unpressured trace as `empty_cache()` (crates/vramroom-trace/src/
replay/plan.rs), and this entry frees no segment of its own.

An entry's `user_metadata` (PyTorch's field for `torch.cuda.memory._set_memory_metadata`)
carries what the trace knows and a real snapshot cannot show: a cuDNN convolution's
workspace is tagged `WORKSPACE_TAG` + the key of the plan that asked for it. When that
allocation fails, PyTorch's cuDNN path catches the OOM (after the allocator has emptied its
cache), runs the next plan the heuristics offer, and keeps that plan for the key; the replay
(crates/vramroom-trace/src/replay/session.rs) does the same, taking the next plan to need no
workspace. Measured: tv_resnet18_infer_nograd at 0.95 of its peak reserved survives on the
H100 with peak allocated 535,011,328 bytes, the trace's peak without the stem conv's
workspace in steps 2 and 3 (device runs 13/13b, capacity sweep).
"""

import pickle

WORKSPACE_TAG = "vramroom.cudnn_conv_workspace:"


def allocator_settings(conf=""):
    return {
        "PYTORCH_CUDA_ALLOC_CONF": conf,
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "graph_capture_record_stream_reuse": False,
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
    }


def build(events, t0_us=1_700_000_000_000_000, meta=None):
    meta = meta or {}
    frame_dicts = {}

    def frames_of(fr):
        out = []
        for f in fr:
            d = frame_dicts.get(f)
            if d is None:
                d = {"filename": f[0], "line": f[1], "name": f[2]}
                frame_dicts[f] = d
            out.append(d)
        return out

    trace = []
    for i, (action, addr, size, stream, fr) in enumerate(events):
        if action == "empty_cache":
            trace.append({"action": "segment_free", "addr": 0, "size": 0, "stream": 0,
                          "time_us": t0_us + i, "compile_context": "N/A",
                          "user_metadata": "", "frames": frames_of(fr)})
            continue
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream,
                      "time_us": t0_us + i, "compile_context": "N/A",
                      "user_metadata": meta.get(i, ""), "frames": frames_of(fr)})
    return {
        "segments": [],
        "device_traces": [trace],
        "allocator_settings": allocator_settings(),
        "external_annotations": [],
    }


def write(events, path, meta=None):
    with open(path, "wb") as f:
        pickle.dump(build(events, meta=meta), f, protocol=4)
    return path
