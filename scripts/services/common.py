"""What the three test services share: a threaded JSON server with the probe inside.

Each service is `python3 SERVICE.py --port P --probe-port Q [--fraction F | --cap-gib G]`. It starts
vramroom_probe before touching CUDA (so the history covers the model's load), caps the GPU
with torch.cuda.set_per_process_memory_fraction (as a shared-GPU service would), loads its
model, answers `POST /infer` with JSON, and prints "ready" once it serves. A CUDA OOM in a
request is answered 507 with PyTorch's message in the body (as many real services do), and
the cache is not emptied: the service keeps going, as it would in production.
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))


def args():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--probe-port", type=int, required=True)
    p.add_argument("--fraction", type=float, default=0.05)
    p.add_argument("--cap-gib", type=float, default=None,
                   help="the memory cap in GiB (fraction = cap / the card's memory: the same "
                        "cap on an H100 and an H200); overrides --fraction")
    p.add_argument("--max-entries", type=int, default=None,
                   help="the probe's history ring (default: the probe sizes it from the run)")
    return p.parse_args()


def fraction(a, torch):
    """The per-process memory fraction: --cap-gib over the card's memory, else --fraction."""
    if a.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        return min(1.0, a.cap_gib * (1 << 30) / total)
    return a.fraction


def serve(a, load_model, handle):
    """`load_model()` returns state; `handle(state, body, probe)` returns a JSON-able dict."""
    from vramroom import probe as vramroom_probe

    probe = vramroom_probe.start(port=a.probe_port, max_entries=a.max_entries)
    import torch

    torch.cuda.init()
    torch.cuda.set_per_process_memory_fraction(fraction(a, torch))
    torch.manual_seed(0)
    state = load_model()
    torch.cuda.synchronize()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *x):
            pass

        def _send(self, code, obj):
            b = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

        def do_GET(self):
            self._send(200, {"ok": True})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                self._send(400, {"error": "bad json"})
                return
            t0 = time.time()
            try:
                out = handle(state, body, probe)
                out["ms"] = round((time.time() - t0) * 1e3, 2)
                self._send(200, out)
            except torch.OutOfMemoryError as e:
                self._send(507, {"error": str(e)})
            except Exception as e:  # a bug in a test service is a 500, not a crash
                self._send(500, {"error": "%s: %s" % (type(e).__name__, e)})

    # As the README says for a standard-library server: each do_POST is one request.
    H = probe.track_handler(H)
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), H)
    srv.daemon_threads = True
    print("ready", flush=True)
    srv.serve_forever()
