"""Ground truth for the live-service prediction, on the GPU machine.

    python3 scripts/services/collect.py VRAMROOM_BIN OUT_DIR [--only bert,gpt2,resnet]

For each test service (bert_encoder.py, gpt2_generate.py, resnet_batch.py), in parallel:
1. a ramp under `vramroom http --stages` (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96 workers,
   6 s each) on a fresh service: the first stage with a CUDA OOM answer (507) is where the
   service really runs out;
2. a gentle run (2 workers, 20 s) on a fresh service, and its probe snapshot and metrics:
   what a prediction starts from;
3. the same gentle run on a fresh service under expandable_segments:True: its real peak
   reserved, for the what-if.
Writes OUT_DIR/<service>/{ramp.json,gentle.pickle,gentle_metrics.txt,expandable.pickle,
expandable_metrics.txt,*.log} and one JSON line per service to OUT_DIR/services.jsonl.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
STAGES = "1:6s,2:6s,4:6s,6:6s,8:6s,12:6s,16:6s,24:6s,32:6s,48:6s,64:6s,96:6s"
SERVICES = {
    "bert": ("bert_encoder.py", 0.043, '{"batch": {{rand_int 1 48}}, "length": {{rand_int 16 512}}}'),
    "gpt2": ("gpt2_generate.py", 0.022,
             '{"batch": {{rand_int 1 8}}, "prompt": {{rand_int 16 512}}, "new": {{rand_int 16 64}}}'),
    "resnet": ("resnet_batch.py", 0.03, '{"images": {{rand_int 1 64}}}'),
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Service:
    def __init__(self, name, out, conf=""):
        script, frac, _ = SERVICES[name]
        self.port, self.probe = free_port(), free_port()
        env = dict(os.environ)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        self.log = open(out, "w")
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), "--port", str(self.port),
             "--probe-port", str(self.probe), "--fraction", str(frac)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("%s did not start: %r" % (name, line))
        self.url = "http://127.0.0.1:%d/infer" % self.port
        self.metrics = "http://127.0.0.1:%d/metrics" % self.probe

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.probe, path), timeout=120) as r:
            return r.read()

    def stop(self):
        self.p.kill()
        self.p.wait()
        self.log.close()


def http(hr, svc, tmpl, args, out):
    cmd = [hr, "http", svc.url, "-m", "POST", "-H", "Content-Type: application/json", "-d", tmpl,
           "--metrics-url", svc.metrics, "--timeout", "60s", "--out", out, "--json", "--quiet"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    try:
        return json.loads(p.stdout), p.returncode, p.stderr[-800:]
    except ValueError:
        return None, p.returncode, p.stderr[-800:]


def one(hr, name, root):
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    _, _, tmpl = SERVICES[name]
    rec = {"service": name, "fraction": SERVICES[name][1]}
    try:
        svc = Service(name, os.path.join(out, "ramp_service.log"))
        r, rc, err = http(hr, svc, tmpl, ["--stages", STAGES], os.path.join(out, "ramp"))
        rec["ramp_rc"], rec["ramp_err"] = rc, err
        rec["ramp_probe_metrics_tail"] = svc.get("/metrics").decode()[-3000:]
        svc.stop()
        if r is not None:
            with open(os.path.join(out, "ramp.json"), "w") as f:
                json.dump(r, f)
            stages = (r.get("http") or {}).get("stages") or []
            rec["stages"] = [{k: s.get(k) for k in ("index", "concurrency", "peak_in_flight",
                                                     "status_codes")} for s in stages]
            first = next((s["concurrency"] for s in stages
                          if (s.get("status_codes") or {}).get("507", 0) > 0), None)
            rec["observed_first_oom_concurrency"] = first
        for label, conf in (("gentle", ""), ("expandable", "expandable_segments:True")):
            svc = Service(name, os.path.join(out, label + "_service.log"), conf)
            r, rc, err = http(hr, svc, tmpl, ["-c", "2", "-z", "20s"], os.path.join(out, label))
            rec[label + "_rc"], rec[label + "_err"] = rc, err
            with open(os.path.join(out, label + ".pickle"), "wb") as f:
                f.write(svc.get("/snapshot"))
            m = svc.get("/metrics").decode()
            with open(os.path.join(out, label + "_metrics.txt"), "w") as f:
                f.write(m)
            svc.stop()
    except Exception as e:
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    return rec


def main():
    hr, root = sys.argv[1], sys.argv[2]
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else list(SERVICES)
    os.makedirs(root, exist_ok=True)
    recs = {}
    ts = [threading.Thread(target=lambda n=n: recs.__setitem__(n, one(hr, n, root))) for n in only]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with open(os.path.join(root, "services.jsonl"), "w") as f:
        for n in only:
            f.write(json.dumps(recs.get(n)) + "\n")
            print(json.dumps(recs.get(n))[:1500], flush=True)


if __name__ == "__main__":
    main()
