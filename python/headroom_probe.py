"""headroom_probe: PyTorch's CUDA memory, served from inside a service, for Headroom.

One pure-Python file (standard library, plus torch at run time). It starts a small HTTP
server on a daemon thread of the service's process and serves what only that process can
see: the caching allocator's statistics, its snapshot, and a snapshot taken at the moment
of an out-of-memory error.

Use in a real service (any PyTorch server: FastAPI, Flask, Triton's Python backend, a
training loop), as early as possible, before the model is loaded, so the allocation
history covers it:

    import headroom_probe
    probe = headroom_probe.start(port=9464)    # host="127.0.0.1", snapshot_dir=...,
                                               # record_history=True
    ... load the model, serve requests ...

Or without touching the code:

    python -m headroom_probe --port 9464 -- my_server.py --its --args

Then point Headroom's load client at the service and the probe:

    headroom http http://127.0.0.1:8000/generate -c 16 -z 60s \\
        --metrics-url http://127.0.0.1:9464/metrics

`headroom http` scrapes the metrics on the load's clock, and at the end fetches the
snapshot (and the OOM snapshot, if the service ran out of memory), replays it under other
allocator configs and adds the findings (fragmentation, cache held, the allocator state at
the OOM) to its report. Prometheus can scrape the same endpoint.

Endpoints:

    GET  /metrics       Prometheus text (format 0.0.4):
                          torch_cuda_memory_stats{device="0",key="allocated_bytes.all.current"}
                            every key of torch.cuda.memory_stats(device), every device in use;
                          torch_cuda_memory_allocated_bytes, torch_cuda_memory_reserved_bytes,
                          torch_cuda_max_memory_allocated_bytes,
                          torch_cuda_max_memory_reserved_bytes   (per device);
                          torch_cuda_device_free_bytes, torch_cuda_device_total_bytes,
                          torch_cuda_device_used_bytes   (torch.cuda.mem_get_info, per device);
                          headroom_probe_ooms_total, headroom_probe_snapshots_total,
                          headroom_probe_info{version,torch,pid,record_history} 1.
    GET  /snapshot      the pickle of torch.cuda.memory._snapshot() (what
                        torch.cuda.memory._dump_snapshot() writes; opens in
                        https://pytorch.org/memory_viz).
    GET  /oom_snapshot  the snapshot taken at the last OOM (404 when there was none).
    POST /dump          writes a snapshot into snapshot_dir; answers the file's path.
    GET  /              JSON: versions, devices, OOMs, snapshot files.

PyTorch APIs used (as of torch 2.11): torch.cuda.memory_stats, memory_allocated,
memory_reserved, max_memory_allocated, max_memory_reserved, mem_get_info,
torch.cuda.memory._record_memory_history, torch.cuda.memory._snapshot and
torch._C._cuda_attach_out_of_memory_observer. The OOM observer is called by the caching
allocator after a failed allocation, with its lock released, so taking a snapshot there
is safe (it is what PyTorch's own memory docs do).

Notes:
- Recording history (record_history=True, the default) keeps the last `max_entries`
  allocation events with Python stacks; it costs a little per allocation. Without it the
  snapshot has the segments but no trace, and Headroom cannot replay it.
- The probe never initialises CUDA itself: until the service has, /metrics holds only the
  probe's own series. memory_stats (and the gauges from it) are exported for every device,
  since they are the allocator's bookkeeping; mem_get_info needs a CUDA context, so it is
  only asked of devices the service already uses (memory reserved there, or the current
  device), and the probe never creates a context of its own on another GPU.
- The server binds 127.0.0.1 by default; bind "0.0.0.0" only on a trusted network (the
  snapshot holds stack traces and file names of the service).
"""

import json
import os
import pickle
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["start", "Probe", "main"]

VERSION = "0.1.0"
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"

_lock = threading.Lock()
_probe = None


def _torch():
    import torch  # imported at run time: the probe is importable without torch

    return torch


def _esc(value):
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return None


class Probe:
    """A running probe. Use `start()` to make one."""

    def __init__(self, host, port, snapshot_dir, record_history, max_entries):
        self.snapshot_dir = snapshot_dir
        self.record_history = bool(record_history)
        self.max_entries = int(max_entries)
        self.ooms = 0
        self.snapshots = 0
        self.files = []
        self.last_oom_file = None
        self.history_error = None
        self._count_lock = threading.Lock()
        os.makedirs(snapshot_dir, exist_ok=True)
        probe = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "headroom_probe/" + VERSION

            def log_message(self, *args):  # quiet: this runs inside someone's service
                pass

            def _send(self, code, body, ctype):
                if isinstance(body, str):
                    body = body.encode("utf-8")
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _fail(self, e):
                self._send(500, "headroom_probe: %s: %s\n" % (type(e).__name__, e), "text/plain")

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._send(200, probe.metrics_text(), CONTENT_TYPE_METRICS)
                    elif path == "/snapshot":
                        self._send(200, probe.snapshot_bytes(), "application/octet-stream")
                    elif path == "/oom_snapshot":
                        f = probe.last_oom_file
                        if f is None or not os.path.exists(f):
                            self._send(404, "no OOM snapshot (no OOM so far)\n", "text/plain")
                        else:
                            with open(f, "rb") as fh:
                                self._send(200, fh.read(), "application/octet-stream")
                    elif path == "/":
                        self._send(200, json.dumps(probe.info(), indent=1) + "\n", "application/json")
                    else:
                        self._send(404, "not found: try /metrics, /snapshot, /oom_snapshot, POST /dump\n", "text/plain")
                except Exception as e:  # never take the service down
                    self._fail(e)

            def do_POST(self):
                path = self.path.split("?", 1)[0]
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                try:
                    if path == "/dump":
                        self._send(200, probe.dump("request") + "\n", "text/plain")
                    else:
                        self._send(404, "not found: POST /dump\n", "text/plain")
                except Exception as e:
                    self._fail(e)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = self._server.server_address[1]
        self.url = "http://%s:%d" % (host if host not in ("", "0.0.0.0") else "127.0.0.1", self.port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="headroom-probe", daemon=True
        )

    # -- torch -----------------------------------------------------------------------

    def _start_history(self):
        if not self.record_history:
            return
        torch = _torch()
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=self.max_entries
            )
        except TypeError:
            # Before torch 2.1 the first argument was a bool.
            try:
                torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=self.max_entries)
            except Exception as e:
                self.history_error = str(e)
        except Exception as e:
            self.history_error = str(e)

    def _attach_oom_observer(self):
        torch = _torch()
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return

        def on_oom(device, alloc, device_allocated, device_free):
            with self._count_lock:
                self.ooms += 1
                n = self.ooms
            try:
                path = self.dump("oom%d" % n, extra={
                    "device": device,
                    "alloc": alloc,
                    "device_allocated": device_allocated,
                    "device_free": device_free,
                })
                self.last_oom_file = path
            except Exception:
                pass  # an OOM must stay the service's error, not the probe's

        attach(on_oom)

    def all_devices(self):
        """Every device, once the service has initialised CUDA (none before)."""
        torch = _torch()
        try:
            if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                return []
            return list(range(torch.cuda.device_count()))
        except Exception:
            return []

    def devices(self):
        """Devices in use: memory reserved there, or the current device."""
        torch = _torch()
        if not self.all_devices():
            return []
        out = []
        for d in range(torch.cuda.device_count()):
            try:
                if torch.cuda.memory_reserved(d) > 0:
                    out.append(d)
            except Exception:
                pass
        try:
            if torch.cuda.is_initialized():
                cur = torch.cuda.current_device()
                if cur not in out:
                    out.append(cur)
        except Exception:
            pass
        return sorted(out)

    def metrics_text(self):
        torch = _torch()
        lines = []

        def family(name, kind, help_text):
            lines.append("# HELP %s %s" % (name, help_text))
            lines.append("# TYPE %s %s" % (name, kind))

        family("headroom_probe_info", "gauge", "The probe: version, torch version, pid.")
        lines.append(
            'headroom_probe_info{version="%s",torch="%s",pid="%d",record_history="%s"} 1'
            % (VERSION, _esc(getattr(torch, "__version__", "?")), os.getpid(),
               "true" if self.record_history and not self.history_error else "false")
        )
        family("headroom_probe_ooms_total", "counter", "OOMs the allocator reported to the probe's observer.")
        lines.append("headroom_probe_ooms_total %d" % self.ooms)
        family("headroom_probe_snapshots_total", "counter", "Snapshots the probe wrote.")
        lines.append("headroom_probe_snapshots_total %d" % self.snapshots)
        devs = self.all_devices()
        if devs:
            family("torch_cuda_memory_stats", "gauge", "torch.cuda.memory_stats(device), one series per key.")
            for d in devs:
                for k, v in torch.cuda.memory_stats(d).items():
                    s = _num(v)
                    if s is not None:
                        lines.append('torch_cuda_memory_stats{device="%d",key="%s"} %s' % (d, _esc(k), s))
            gauges = [
                ("torch_cuda_memory_allocated_bytes", "torch.cuda.memory_allocated(device).", torch.cuda.memory_allocated),
                ("torch_cuda_memory_reserved_bytes", "torch.cuda.memory_reserved(device).", torch.cuda.memory_reserved),
                ("torch_cuda_max_memory_allocated_bytes", "torch.cuda.max_memory_allocated(device).", torch.cuda.max_memory_allocated),
                ("torch_cuda_max_memory_reserved_bytes", "torch.cuda.max_memory_reserved(device).", torch.cuda.max_memory_reserved),
            ]
            for name, help_text, fn in gauges:
                family(name, "gauge", help_text)
                for d in devs:
                    lines.append('%s{device="%d"} %d' % (name, d, int(fn(d))))
            info = {}
            for d in self.devices():
                try:
                    info[d] = torch.cuda.mem_get_info(d)
                except Exception:
                    pass
            if info:
                for name, help_text, pick in [
                    ("torch_cuda_device_free_bytes", "torch.cuda.mem_get_info(device)[0].", lambda fr, to: fr),
                    ("torch_cuda_device_total_bytes", "torch.cuda.mem_get_info(device)[1].", lambda fr, to: to),
                    ("torch_cuda_device_used_bytes", "total - free: every process on the device.", lambda fr, to: to - fr),
                ]:
                    family(name, "gauge", help_text)
                    for d, (fr, to) in sorted(info.items()):
                        lines.append('%s{device="%d"} %d' % (name, d, int(pick(fr, to))))
        return "\n".join(lines) + "\n"

    def snapshot_bytes(self):
        torch = _torch()
        return pickle.dumps(torch.cuda.memory._snapshot())

    def dump(self, reason="request", extra=None):
        """Writes a snapshot file; returns its path."""
        data = self.snapshot_bytes()
        with self._count_lock:
            self.snapshots += 1
            n = self.snapshots
        name = "snapshot_%d_%s_%d_%d.pickle" % (os.getpid(), reason, n, int(time.time()))
        path = os.path.join(self.snapshot_dir, name)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.files.append({"path": path, "reason": reason, "time": time.time(), "extra": extra or {}})
        return path

    def info(self):
        torch = _torch()
        return {
            "probe": VERSION,
            "torch": getattr(torch, "__version__", "?"),
            "pid": os.getpid(),
            "cuda_available": bool(torch.cuda.is_available()),
            "devices": self.devices(),
            "record_history": self.record_history,
            "history_error": self.history_error,
            "ooms": self.ooms,
            "snapshot_dir": self.snapshot_dir,
            "snapshots": self.files,
            "endpoints": ["/metrics", "/snapshot", "/oom_snapshot", "POST /dump"],
        }

    def start(self):
        self._start_history()
        self._attach_oom_observer()
        self._thread.start()
        return self

    def stop(self):
        """Stops the HTTP server (the OOM observer stays attached: torch cannot detach it)."""
        self._server.shutdown()
        self._server.server_close()


def start(port=9464, host="127.0.0.1", snapshot_dir=None, record_history=True, max_entries=100000):
    """Starts the probe once per process (a second call returns the first probe).

    port: 0 picks a free port (see `probe.port`). snapshot_dir: where /dump and OOM
    snapshots go (default: a folder in the system's temp dir named after the pid).
    record_history: record allocation history (needed for Headroom's replays).
    """
    global _probe
    with _lock:
        if _probe is not None:
            return _probe
        if snapshot_dir is None:
            snapshot_dir = os.path.join(tempfile.gettempdir(), "headroom_probe_%d" % os.getpid())
        _probe = Probe(host, int(port), snapshot_dir, record_history, max_entries).start()
        return _probe


def main(argv=None):
    """`python -m headroom_probe [--port N] [--host H] [--snapshot-dir D] [--no-history]
    [--max-entries N] -- script.py [args...]`: runs the script with the probe started."""
    import argparse
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    script = []
    if "--" in argv:
        i = argv.index("--")
        argv, script = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m headroom_probe", description=main.__doc__)
    p.add_argument("--port", type=int, default=9464)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--snapshot-dir", default=None)
    p.add_argument("--no-history", action="store_true")
    p.add_argument("--max-entries", type=int, default=100000)
    a = p.parse_args(argv)
    probe = start(a.port, a.host, a.snapshot_dir, not a.no_history, a.max_entries)
    sys.stderr.write("headroom_probe: serving %s/metrics\n" % probe.url)
    if not script:
        sys.stderr.write("headroom_probe: no script given; serving until Ctrl-C\n")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    sys.argv = script
    runpy.run_path(script[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
