"""vramroom.probe: PyTorch's CUDA memory, served from inside a service, for Vramroom.

One pure-Python module (standard library, plus torch at run time; it runs from a source
checkout too, with PYTHONPATH=python). It starts a small HTTP
server on a daemon thread of the service's process and serves what only that process can
see: the caching allocator's statistics, its snapshot, and a snapshot taken at the moment
of an out-of-memory error.

Use in a real service (any PyTorch server: FastAPI, Flask, Triton's Python backend, a
training loop), as early as possible, before the model is loaded, so the allocation
history covers it:

    from vramroom import probe as vramroom_probe
    probe = vramroom_probe.start(port=9464)    # host="127.0.0.1", snapshot_dir=...,
                                               # record_history=True
    ... load the model, serve requests ...

Or without touching the code:

    python -m vramroom.probe --port 9464 -- my_server.py --its --args

Then point Vramroom's load client at the service and the probe:

    vramroom http http://127.0.0.1:8000/generate -c 16 -z 60s \\
        --metrics-url http://127.0.0.1:9464/metrics

`vramroom http` scrapes the metrics on the load's clock, and at the end fetches the
snapshot (and the OOM snapshot, if the service ran out of memory), replays it under other
allocator configs and adds the findings (fragmentation, cache held, the allocator state at
the OOM) to its report. Prometheus can scrape the same endpoint.

In a torchrun job (DDP, FSDP, one replica per GPU), start it the same way in every rank: a
fixed port is a base, and each rank listens on port + LOCAL_RANK (9464, 9465, ...), and says
its RANK and LOCAL_RANK in vramroom_probe_info. `vramroom watch URL...` and `vramroom http
--metrics-url ... --metrics-url ...` scrape all ranks onto one timeline.

Request attribution: wrap each request's work so its allocations carry the request's tag
(PyTorch copies a thread's memory metadata into every trace entry), and Vramroom can cut
the trace into requests, show memory per request against its size, and predict the
concurrency at which the service runs out of memory (`vramroom http --predict`):

    with probe.request(tokens=input_ids.numel(), items=input_ids.shape[0]):
        out = model(input_ids)

    # standard library server: every do_GET/do_POST/... of the handler is one request
    Handler = probe.track_handler(Handler)
    # WSGI apps (Flask: app.wsgi_app = probe.wsgi(app.wsgi_app)): one request per call
    # FastAPI / async code: `with probe.request(...)` inside a sync endpoint (it runs on
    # one thread); tags are per thread, so async code awaiting between GPU calls mixes them.

Each tag also names its thread (`thread=K`, K counted from 1 in the order threads first tag a
request) and, when the work runs on a thread other than the handler's while a handler waits
(a batcher or worker thread, as `probe.request` inside a queue consumer), `worker=1`. From a
gentle run alone, one thread per request and one worker thread serving every request look the
same in memory; these two fields tell them apart (`vramroom http --predict` does not stack
requests that one worker thread runs one after another).

Endpoints:

    GET  /metrics       Prometheus text (format 0.0.4):
                          torch_cuda_memory_stats{device="0",key="allocated_bytes.all.current"}
                            every key of torch.cuda.memory_stats(device), every device in use;
                          torch_cuda_memory_allocated_bytes, torch_cuda_memory_reserved_bytes,
                          torch_cuda_max_memory_allocated_bytes,
                          torch_cuda_max_memory_reserved_bytes   (per device);
                          torch_cuda_device_free_bytes, torch_cuda_device_total_bytes,
                          torch_cuda_device_used_bytes   (torch.cuda.mem_get_info, per device);
                          torch_cuda_memory_fraction (per device: the per-process fraction,
                            1 when unset), torch_cuda_device_capacity_bytes (per device: what
                            this process may reserve: fraction x total memory),
                          vramroom_probe_ooms_total (the largest of the OOM observer's count,
                            the allocators' num_ooms and the OOMs raised in tracked requests),
                          vramroom_probe_requests_total, vramroom_probe_requests_in_flight,
                          vramroom_probe_request_ooms_total, vramroom_probe_snapshots_total,
                          vramroom_probe_info{version,torch,pid,record_history} 1.
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
  snapshot has the segments but no trace, and Vramroom cannot replay it.
- The history ring is sized from the run by default (max_entries=None): it starts at
  100000 events and, after each tracked request, grows to hold the model's load and
  `history_requests` (200) requests at the events per request seen so far, up to
  `max_history_entries` (2000000). It grows only while it has not wrapped (a ring that
  has wrapped cannot grow without scrambling its order), so one long first request can
  still overflow it; /metrics says so (vramroom_probe_history_max_entries,
  vramroom_probe_history_events, vramroom_probe_history_wrapped), and `vramroom http
  --predict` says how many requests its prediction rests on. A number fixes the size.
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

__all__ = ["start", "Probe", "main", "request"]

VERSION = "0.2.0"
AUTO_START_ENTRIES = 100_000
TAG_PREFIX = "vramroom:req="
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

    def __init__(self, host, port, snapshot_dir, record_history, max_entries,
                 history_requests=200, max_history_entries=2_000_000):
        self.snapshot_dir = snapshot_dir
        self.record_history = bool(record_history)
        # None: sized from the run (see the module's notes); a number: fixed.
        self.auto_entries = max_entries is None
        self.max_entries = AUTO_START_ENTRIES if max_entries is None else int(max_entries)
        self.history_requests = int(history_requests)
        self.max_history_entries = max(int(max_history_entries), self.max_entries)
        self.history_resizes = 0
        self.history_wrapped = False
        self._events_start = None   # history events when the first request began
        self._requests_done = 0
        self._grow_lock = threading.Lock()
        self.ooms = 0
        self.requests = 0
        self.in_flight = 0
        self.request_ooms = 0
        self.snapshots = 0
        self.files = []
        self.last_oom_file = None
        self.history_error = None
        self._count_lock = threading.Lock()
        # Threads inside a handler-level request (track_handler, wsgi) right now, and a small
        # number per thread that ever tagged a request (tags stay short and stable).
        self._handler_threads = {}
        self._thread_ids = {}
        os.makedirs(snapshot_dir, exist_ok=True)
        probe = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "vramroom_probe/" + VERSION

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
                self._send(500, "vramroom.probe: %s: %s\n" % (type(e).__name__, e), "text/plain")

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
            target=self._server.serve_forever, name="vramroom-probe", daemon=True
        )

    # -- torch -----------------------------------------------------------------------

    def _history_events(self):
        """Trace entries recorded so far on the busiest device (an estimate from the
        allocator's counters: an allocation is one entry, a free two, a segment one), or
        None before CUDA is initialised."""
        torch = _torch()
        best = None
        for d in self.all_devices():
            try:
                st = torch.cuda.memory_stats(d)
            except Exception:
                continue
            n = (int(st.get("allocation.all.allocated", 0)) + 2 * int(st.get("allocation.all.freed", 0))
                 + int(st.get("segment.all.allocated", 0)) + int(st.get("segment.all.freed", 0)))
            best = n if best is None else max(best, n)
        return best

    def _request_started(self):
        if self.auto_entries and self._events_start is None:
            ev = self._history_events()
            start_watch = False
            with self._count_lock:
                if self._events_start is None:
                    self._events_start = ev or 0
                    start_watch = True
            if start_watch and self.record_history and not self.history_error:
                threading.Thread(target=self._watch_history, name="vramroom-probe-history",
                                 daemon=True).start()

    def _watch_history(self):
        """While the ring can still grow: a request longer than the ring (a long generate())
        must not wrap it before it ends, so the ring is quadrupled whenever it is half full."""
        while (self.auto_entries and not self.history_wrapped
               and self.max_entries < self.max_history_entries):
            time.sleep(0.2)
            with self._grow_lock:
                ev = self._history_events()
                if ev is None:
                    continue
                if ev >= self.max_entries:
                    self.history_wrapped = True
                    return
                if ev > self.max_entries // 2:
                    new = min(self.max_history_entries, 4 * self.max_entries)
                    try:
                        self._record(new)
                    except Exception:
                        self.auto_entries = False
                        return
                    self.max_entries = new
                    self.history_resizes += 1

    def _request_done(self):
        """Grows the history ring to hold `history_requests` requests (see the notes)."""
        with self._count_lock:
            self._requests_done += 1
            done = self._requests_done
        if (not self.auto_entries or not self.record_history or self.history_error
                or self.history_wrapped or self.max_entries >= self.max_history_entries):
            return
        if not self._grow_lock.acquire(blocking=False):
            return  # another request is checking
        try:
            ev = self._history_events()
            if ev is None:
                return
            if ev >= self.max_entries:
                self.history_wrapped = True  # too late to grow in order
                return
            first = self._events_start or 0
            per = max(0.0, (ev - first) / float(max(done, 1)))
            need = int(first + per * self.history_requests * 1.25) + 1000
            if need <= self.max_entries:
                return
            new = min(self.max_history_entries, max(need, 2 * self.max_entries))
            try:
                self._record(new)
            except Exception:
                self.auto_entries = False  # this torch cannot resize it: keep the ring
                return
            self.max_entries = new
            self.history_resizes += 1
        finally:
            self._grow_lock.release()

    def _record(self, max_entries):
        torch = _torch()
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=max_entries
        )

    def _start_history(self):
        if not self.record_history:
            return
        torch = _torch()
        try:
            self._record(self.max_entries)
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

        try:
            attach(on_oom)
        except Exception as e:  # no CUDA here: the probe still serves what it can
            self.history_error = self.history_error or str(e)

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

        family("vramroom_probe_info", "gauge", "The probe: version, torch version, pid.")
        ranks = "".join(',%s="%s"' % (lbl, _esc(os.environ[k]))
                        for lbl, k in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"),
                                       ("world_size", "WORLD_SIZE"))
                        if os.environ.get(k, "").strip())
        lines.append(
            'vramroom_probe_info{version="%s",torch="%s",pid="%d",record_history="%s"%s} 1'
            % (VERSION, _esc(getattr(torch, "__version__", "?")), os.getpid(),
               "true" if self.record_history and not self.history_error else "false", ranks)
        )
        family("vramroom_probe_ooms_total", "counter",
               "CUDA OOMs: the largest of the observer's count, the allocators' num_ooms and tracked requests' OOMs.")
        lines.append("vramroom_probe_ooms_total %d" % self.oom_count())
        family("vramroom_probe_requests_total", "counter", "Requests tracked with probe.request().")
        lines.append("vramroom_probe_requests_total %d" % self.requests)
        family("vramroom_probe_requests_in_flight", "gauge", "Tracked requests running now.")
        lines.append("vramroom_probe_requests_in_flight %d" % self.in_flight)
        family("vramroom_probe_request_ooms_total", "counter", "Tracked requests that raised torch.OutOfMemoryError.")
        lines.append("vramroom_probe_request_ooms_total %d" % self.request_ooms)
        family("vramroom_probe_snapshots_total", "counter", "Snapshots the probe wrote.")
        lines.append("vramroom_probe_snapshots_total %d" % self.snapshots)
        family("vramroom_probe_history_max_entries", "gauge",
               "The allocation history ring's size (entries); it grows with the run unless fixed.")
        lines.append("vramroom_probe_history_max_entries %d" % self.max_entries)
        ev = self._history_events()
        if ev is not None:
            family("vramroom_probe_history_events", "gauge",
                   "Allocation history events so far on the busiest device (estimate); past max_entries the oldest are gone.")
            lines.append("vramroom_probe_history_events %d" % ev)
        family("vramroom_probe_history_wrapped", "gauge",
               "1 when the ring overflowed before it could grow: the trace lost its oldest events.")
        lines.append("vramroom_probe_history_wrapped %d" % (
            1 if self.history_wrapped or (ev is not None and ev > self.max_entries) else 0))
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
            caps = self.capacities()
            if caps:
                family("torch_cuda_memory_fraction", "gauge",
                       "torch.cuda.get_per_process_memory_fraction(device); 1 when unset.")
                for d, (frac, _, _) in sorted(caps.items()):
                    lines.append('torch_cuda_memory_fraction{device="%d"} %s' % (d, repr(float(frac))))
                family("torch_cuda_device_capacity_bytes", "gauge",
                       "What this process may reserve on the device: fraction x total memory.")
                for d, (_, cap, _) in sorted(caps.items()):
                    lines.append('torch_cuda_device_capacity_bytes{device="%d"} %d' % (d, cap))
                family("torch_cuda_device_total_memory_bytes", "gauge", "The device's total memory.")
                for d, (_, _, total) in sorted(caps.items()):
                    lines.append('torch_cuda_device_total_memory_bytes{device="%d"} %d' % (d, total))
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

    def capacities(self):
        """{device: (fraction, capacity bytes, total bytes)} for every device of the process.

        The capacity is what the allocator may reserve: PyTorch refuses a new segment when
        reserved + its size would pass fraction x total, so a service capped with
        set_per_process_memory_fraction runs out there, not at the card's size."""
        torch = _torch()
        out = {}
        for d in self.all_devices():
            try:
                total = int(torch.cuda.get_device_properties(d).total_memory)
                getf = getattr(torch.cuda, "get_per_process_memory_fraction", None)
                frac = float(getf(d)) if getf is not None else 1.0
                cap = total if frac >= 1.0 else int(frac * total)
                out[d] = (frac, cap, total)
            except Exception:
                pass
        return out

    def oom_count(self):
        """OOMs, from every source that sees them: the observer (called by the caching
        allocator), the allocators' own num_ooms, and tracked requests that raised."""
        torch = _torch()
        stats_ooms = 0
        for d in self.all_devices():
            try:
                stats_ooms += int(torch.cuda.memory_stats(d).get("num_ooms", 0))
            except Exception:
                pass
        return max(self.ooms, stats_ooms, self.request_ooms)

    # -- requests ------------------------------------------------------------------------

    def request(self, id=None, items=None, tokens=None, bytes=None):
        """A context manager: the allocations made on this thread inside it are tagged as
        one request (with its size, when given), and an OutOfMemoryError raised inside it
        is counted. Nests: the outer tag comes back at exit."""
        return _Request(self, id, items, tokens, bytes)

    def _handler_request(self, bytes_):
        """A request entered by the server-side wrappers (one per HTTP request)."""
        return _Request(self, None, None, None, bytes_, handler=True)

    def _thread_tag(self, handler):
        """(thread number, worker) for a request entered now on this thread."""
        tid = threading.get_ident()
        with self._count_lock:
            k = self._thread_ids.setdefault(tid, len(self._thread_ids) + 1)
            others = sum(n for t, n in self._handler_threads.items() if t != tid)
            worker = not handler and self._handler_threads.get(tid, 0) == 0 and others > 0
            if handler:
                self._handler_threads[tid] = self._handler_threads.get(tid, 0) + 1
        return k, worker

    def _handler_done(self):
        tid = threading.get_ident()
        with self._count_lock:
            n = self._handler_threads.get(tid, 0) - 1
            if n > 0:
                self._handler_threads[tid] = n
            else:
                self._handler_threads.pop(tid, None)

    def track_handler(self, handler_cls):
        """A subclass of an http.server handler whose do_* methods each run as one request."""
        probe = self
        methods = {}
        for name in dir(handler_cls):
            if name.startswith("do_") and callable(getattr(handler_cls, name)):
                def wrap(fn):
                    def run(handler, *a, **kw):
                        n = handler.headers.get("Content-Length") if handler.headers else None
                        with probe._handler_request(int(n) if n and n.isdigit() else None):
                            return fn(handler, *a, **kw)
                    return run
                methods[name] = wrap(getattr(handler_cls, name))
        return type(handler_cls.__name__, (handler_cls,), methods)

    def wsgi(self, app):
        """WSGI middleware: each call of the app is one request (WSGI servers run a request
        on one thread). The body size comes from CONTENT_LENGTH."""
        probe = self

        def wrapped(environ, start_response):
            n = environ.get("CONTENT_LENGTH") or ""
            with probe._handler_request(int(n) if n.isdigit() else None):
                return app(environ, start_response)

        return wrapped

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
            "history_max_entries": self.max_entries,
            "history_auto": self.auto_entries,
            "history_resizes": self.history_resizes,
            "history_events": self._history_events(),
            "ooms": self.oom_count(),
            "requests": self.requests,
            "request_ooms": self.request_ooms,
            "capacities": {str(d): {"fraction": f, "capacity_bytes": c, "total_bytes": t}
                           for d, (f, c, t) in self.capacities().items()},
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


class _Request:
    _ids = 0
    _ids_lock = threading.Lock()

    def __init__(self, probe, id, items, tokens, bytes_, handler=False):
        self.probe = probe
        self.handler = handler
        if id is None:
            with _Request._ids_lock:
                _Request._ids += 1
                id = "%d-%d" % (os.getpid(), _Request._ids)
        parts = [TAG_PREFIX + str(id).replace(";", ",")]
        for k, v in (("items", items), ("tokens", tokens), ("bytes", bytes_)):
            if v is not None:
                parts.append("%s=%d" % (k, int(v)))
        self.parts = parts  # the tag, less the thread fields __enter__ adds
        self.prev = None

    def __enter__(self):
        # The thread is the one that enters, which may differ from the one that made this.
        k, worker = self.probe._thread_tag(self.handler)
        self.tag = ";".join(self.parts + ["thread=%d" % k] + (["worker=1"] if worker else []))
        torch = _torch()
        mem = torch.cuda.memory
        get = getattr(mem, "_get_memory_metadata", None)
        try:
            self.prev = get() if get is not None else ""
        except Exception:
            self.prev = ""
        setter = getattr(mem, "_set_memory_metadata", None)
        if setter is not None:
            try:
                setter(self.tag)
            except Exception:
                pass
        with self.probe._count_lock:
            self.probe.requests += 1
            self.probe.in_flight += 1
        try:
            self.probe._request_started()
        except Exception:
            pass
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.handler:
            self.probe._handler_done()
        torch = _torch()
        setter = getattr(torch.cuda.memory, "_set_memory_metadata", None)
        if setter is not None:
            try:
                setter(self.prev or "")
            except Exception:
                pass
        oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
        is_oom = exc is not None and (
            (oom_type is not None and isinstance(exc, oom_type))
            or "CUDA out of memory" in str(exc)
        )
        with self.probe._count_lock:
            self.probe.in_flight -= 1
            if is_oom:
                self.probe.request_ooms += 1
        try:
            self.probe._request_done()
        except Exception:
            pass  # sizing the ring must never fail a request
        return False


def request(id=None, items=None, tokens=None, bytes=None):
    """`probe.request(...)` on the running probe; a plain context when none runs."""
    p = _probe
    if p is None:
        import contextlib
        return contextlib.nullcontext()
    return p.request(id, items, tokens, bytes)


def rank_port(port, env=None):
    """The port this process listens on: `port` + LOCAL_RANK in a torchrun job (LOCAL_RANK
    set to a whole number), else `port`; 0 stays 0 (a free port)."""
    env = os.environ if env is None else env
    port = int(port)
    lr = str(env.get("LOCAL_RANK", "")).strip()
    if port == 0 or not lr.isdigit():
        return port
    return port + int(lr)


def start(port=9464, host="127.0.0.1", snapshot_dir=None, record_history=True, max_entries=None,
          history_requests=200, max_history_entries=2_000_000):
    """Starts the probe once per process (a second call returns the first probe).

    port: 0 picks a free port (see `probe.port`); any other port is a base in a torchrun
    job: the rank listens on port + LOCAL_RANK (so ranks on one host do not collide).
    snapshot_dir: where /dump and OOM
    snapshots go (default: a folder in the system's temp dir named after the pid).
    record_history: record allocation history (needed for Vramroom's replays).
    max_entries: the history ring's size; None (the default) sizes it from the run: it
    grows to hold `history_requests` requests, up to `max_history_entries` events.
    """
    global _probe
    with _lock:
        if _probe is not None:
            return _probe
        if snapshot_dir is None:
            snapshot_dir = os.path.join(tempfile.gettempdir(), "vramroom_probe_%d" % os.getpid())
        _probe = Probe(host, rank_port(port), snapshot_dir, record_history, max_entries,
                       history_requests, max_history_entries).start()
        return _probe


def main(argv=None):
    """`python -m vramroom.probe [--port N] [--host H] [--snapshot-dir D] [--no-history]
    [--max-entries N] -- script.py [args...]`: runs the script with the probe started."""
    import argparse
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    script = []
    if "--" in argv:
        i = argv.index("--")
        argv, script = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m vramroom.probe", description=main.__doc__)
    p.add_argument("--port", type=int, default=9464)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--snapshot-dir", default=None)
    p.add_argument("--no-history", action="store_true")
    p.add_argument("--max-entries", type=int, default=None,
                   help="history ring size (default: sized from the run)")
    a = p.parse_args(argv)
    probe = start(a.port, a.host, a.snapshot_dir, not a.no_history, a.max_entries)
    sys.stderr.write("vramroom.probe: serving %s/metrics\n" % probe.url)
    if not script:
        sys.stderr.write("vramroom.probe: no script given; serving until Ctrl-C\n")
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
