"""python/vramroom/probe.py against a real PyTorch service, loaded by `vramroom http` (GPU).

    python3 scripts/probe_check.py VRAMROOM_BIN OUT_DIR

Starts a small PyTorch inference service in a child process (a GPT-2-sized MLP stack on
cuda:0 behind http.server; each request's batch size comes from its body, so the caching
allocator sees variable sizes) with vramroom_probe started on a second port, runs
`vramroom http` against it with --metrics-url on the probe, makes the service hit one real
CUDA OOM mid-run (GET /oom asks for more than the card has), and checks what came back:
the probe's series on the timeline, the snapshot and the OOM snapshot fetched and replayed,
and the findings. Prints one line per check and "probe checks: N passed, M failed".
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SERVICE = r'''
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
sys.path.insert(0, sys.argv[3])
from vramroom import probe as vramroom_probe
probe = vramroom_probe.start(port=int(sys.argv[2]), host="127.0.0.1", snapshot_dir=sys.argv[4])
import torch
torch.manual_seed(0)
layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                                   torch.nn.Linear(4096, 1024)) for _ in range(6)]).cuda().eval()
lock = threading.Lock()

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        if self.path == "/oom":
            try:
                free, total = torch.cuda.mem_get_info()
                torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
                self._send(200, {"oom": False})
            except torch.OutOfMemoryError as e:
                self._send(200, {"oom": True, "message": str(e)[:200]})
            return
        self._send(200, {"ok": True})
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        rows = max(1, min(int(body.get("rows", 8)), 4096))
        with lock, torch.no_grad():
            x = torch.randn(rows, 1024, device="cuda")
            y = layers(x).sum().item()
        self._send(200, {"rows": rows, "y": y})

srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("ready", flush=True)
srv.serve_forever()
'''


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    hr, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    snaps = os.path.join(out, "probe_snaps")
    os.makedirs(snaps, exist_ok=True)
    sp, pp = free_port(), free_port()
    svc_path = os.path.join("/tmp", "probe_service.py")
    with open(svc_path, "w") as f:
        f.write(SERVICE)
    svc = subprocess.Popen([sys.executable, svc_path, str(sp), str(pp), os.path.join(ROOT, "python"),
                            snaps], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print("check %-34s %s %s" % (name, "ok" if ok else "FAILED", detail), flush=True)

    try:
        line = svc.stdout.readline()
        check("service started", line.strip() == "ready", line.strip())
        # One OOM while the load runs, after a second.
        def oom_later():
            time.sleep(2.0)
            with urllib.request.urlopen(f"http://127.0.0.1:{sp}/oom", timeout=30) as r:
                return json.loads(r.read())
        import threading
        oom = {}
        t = threading.Thread(target=lambda: oom.update(oom_later()))
        t.start()
        res_dir = os.path.join(out, "probe_http")
        cmd = [hr, "http", f"http://127.0.0.1:{sp}/infer", "-c", "4", "-z", "6s",
               "-d", '{"rows": {{rand_int 1 4096}}}', "--metrics-url", f"http://127.0.0.1:{pp}/metrics",
               "--metrics-interval", "100ms", "--out", res_dir, "--json", "--quiet"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        t.join(timeout=60)
        check("vramroom http exit 0", p.returncode == 0, p.stderr.strip()[-300:])
        check("the service really ran out of memory", oom.get("oom") is True, str(oom)[:120])
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        http = r.get("http") or {}
        check("requests answered 200", (http.get("status_codes") or {}).get("200", 0) > 0,
              json.dumps(http.get("status_codes")))
        srcs = r.get("memory_sources", [])
        probe_src = [s for s in srcs if s.get("kind") == "probe"]
        check("probe scraped as a memory source", bool(probe_src) and probe_src[0].get("samples", 0) > 10,
              json.dumps(probe_src)[:300])
        series = set(probe_src[0].get("series", [])) if probe_src else set()
        check("allocated and reserved series from torch", {"allocated", "reserved"} <= series, str(sorted(series)))
        tl = r.get("timeline", [])
        alloc_pts = [s for s in tl if (s.get("allocated_bytes") or 0) > 0]
        check("timeline holds the service's allocated bytes", len(alloc_pts) > 10, "%d samples" % len(alloc_pts))
        pr = http.get("probe") or {}
        check("probe snapshot fetched and read", pr.get("snapshot_fetched") is True
              and pr.get("trace_entries", 0) > 0, json.dumps(pr)[:300])
        check("probe counted the OOM", pr.get("ooms", 0) >= 1, str(pr.get("ooms")))
        check("OOM snapshot fetched and read", pr.get("oom_snapshot_fetched") is True, "")
        nv = [s for s in srcs if s.get("kind") == "nvml"]
        check("NVML sampled the service's process", bool(nv) and nv[0].get("status") == "ok",
              json.dumps(nv)[:200])
        check("report written", os.path.exists(os.path.join(res_dir, "report.html")), res_dir)
        print("findings:", [f.get("kind") or f.get("id") for f in r.get("findings", [])], flush=True)
    finally:
        svc.kill()
        svc.wait(timeout=10)
    npass = sum(results)
    print("probe checks: %d passed, %d failed" % (npass, len(results) - npass), flush=True)


if __name__ == "__main__":
    main()
