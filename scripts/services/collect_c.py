"""Device run c: predict each service's OOM concurrency from a gentle run, then confirm it.

    python3 scripts/services/collect_c.py VRAMROOM_BIN OUT_DIR [--only bert,gpt2,resnet]
    python3 scripts/services/collect_c.py VRAMROOM_BIN OUT_DIR --fake   # CPU, torch stub

For each service (bert_encoder.py, gpt2_generate.py, resnet_batch.py, each under its memory
fraction), in parallel, each step on a fresh service process:
1. gentle: `vramroom http --predict -c 1 -n N --seed 7` (one request at a time, a fixed
   request sequence: at most a quarter of run b's OOM points 24/16/12), with the what-ifs
   expandable_segments:True and max_split_size_mb:128 and --target-concurrency for the
   size caps. Writes gentle/results.json (http.prediction) and report.html.
2. ramp: `vramroom http --ramp-until-oom --predicted-from gentle/results.json`: 1, 2, 4, 6,
   8, 12, 16, 24, ... workers, 6 s each, stopping at the first OOM.
3. expandable: the same fixed sequence as 1 on a service started with
   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; its real max_memory_reserved against
   the what-if's peak reserved from step 1's trace (target: within 5%).
Every vramroom call has a timeout; a failing step or service is recorded and the rest go
on. Writes OUT_DIR/<service>/{gentle,ramp,expandable}/ and OUT_DIR/run_c.jsonl (one line per
service) and prints a summary table.

--fake runs the same steps on CPU against fake_service.py on the torch stub (a service that
really runs out at a known concurrency): the dry run of the GPU script.
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
REPO = os.path.dirname(os.path.dirname(HERE))
STUB = os.path.join(REPO, "crates", "vramroom-load", "tests", "fixtures", "torch_stub")
SEED = "7"
WHAT_IF = ["expandable_segments:True", "max_split_size_mb:128"]
# name: (script, fraction, body template, gentle requests, target concurrency for the caps)
SERVICES = {
    "bert": ("bert_encoder.py", 0.043,
             '{"batch": {{rand_int 1 48}}, "length": {{rand_int 16 512}}}', 150, 16),
    "gpt2": ("gpt2_generate.py", 0.022,
             '{"batch": {{rand_int 1 8}}, "prompt": {{rand_int 16 512}}, "new": {{rand_int 16 64}}}',
             40, 12),
    "resnet": ("resnet_batch.py", 0.03, '{"images": {{rand_int 1 64}}}', 150, 8),
}
# 64 MiB model + 10 requests of 40 MiB fit in 484 MiB of the stub's 80 GiB: OOM at 11-12.
FAKE = {"fake": ("fake_service.py", 484 / (80 * 1024), '{"k": 2}', 40, 8)}
TIMEOUTS = {"gentle": 200, "ramp": 240, "expandable": 120}
# The device call's limit is 600 s: the summary is written by then whatever still runs.
DEADLINE_S = 530


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Service:
    def __init__(self, table, name, log_path, conf="", fake=False):
        script, frac = table[name][0], table[name][1]
        self.port, self.probe = free_port(), free_port()
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        if fake:
            env["PYTHONPATH"] = STUB + os.pathsep + env.get("PYTHONPATH", "")
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), "--port", str(self.port),
             "--probe-port", str(self.probe), "--fraction", repr(frac)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        box = []
        t = threading.Thread(target=lambda: box.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(180)
        if not box or box[0].strip() != "ready":
            self.stop()
            raise RuntimeError("%s did not start (see %s): %r" % (name, log_path, box))
        self.url = "http://127.0.0.1:%d/infer" % self.port
        self.metrics = "http://127.0.0.1:%d/metrics" % self.probe

    def metric(self, name):
        try:
            with urllib.request.urlopen(self.metrics, timeout=60) as r:
                text = r.read().decode()
        except Exception:
            return None
        vals = [float(l.split()[-1]) for l in text.splitlines()
                if l.startswith(name + "{") or l.startswith(name + " ")]
        return sum(vals) if vals else None

    def stop(self):
        try:
            self.p.kill()
            self.p.wait(timeout=30)
        except Exception:
            pass
        self.log.close()


def vramroom(hr, svc, tmpl, args, out, timeout):
    cmd = [hr, "http", svc.url, "-m", "POST", "-H", "Content-Type: application/json", "-d", tmpl,
           "--metrics-url", svc.metrics, "--timeout", "60s", "--out", out, "--json", "--quiet",
           "--seed", SEED] + args
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout", "vramroom http ran past %ds" % timeout
    try:
        return json.loads(p.stdout), p.returncode, p.stderr[-1500:]
    except ValueError:
        return None, p.returncode, p.stderr[-1500:]


def what_if_peak(res, conf):
    for w in (res or {}).get("what_if") or []:
        if w.get("alloc_conf") == conf:
            return w.get("peak_reserved_bytes")
    return None


def save(out, rec):
    """The record so far: what a step measured survives a later step's failure."""
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump(rec, f)


def one(hr, table, name, root, fake, rec):
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    script, frac, tmpl, n, target = table[name]
    rec.update({"service": name, "fraction": frac, "gentle_requests": n})
    gentle = None
    # 1. gentle, with the prediction
    try:
        svc = Service(table, name, os.path.join(out, "gentle_service.log"), fake=fake)
        try:
            args = ["-c", "1", "-n", str(n), "--predict", "--target-concurrency", str(target)]
            for w in WHAT_IF:
                args += ["--what-if", w]
            t0 = time.time()
            gentle, rc, err = vramroom(hr, svc, tmpl, args, os.path.join(out, "gentle"),
                                       TIMEOUTS["gentle"])
            rec["gentle_s"] = round(time.time() - t0, 1)
            rec["gentle_rc"], rec["gentle_err"] = rc, err
            rec["gentle_max_reserved"] = svc.metric("torch_cuda_max_memory_reserved_bytes")
        finally:
            svc.stop()
        pred = ((gentle or {}).get("http") or {}).get("prediction") or {}
        rec["predicted_first_oom"] = pred.get("first_oom_concurrency")
        rec["predicted"] = [
            {"device": d.get("device"), "limit_bytes": d.get("limit_bytes"),
             "configs": {c.get("alloc_conf") or "default": c.get("first_oom_concurrency")
                         for c in d.get("configs") or []},
             "size_cap": d.get("size_cap"),
             "bytes_per_unit": (d.get("attribution") or {}).get("bytes_per_unit"),
             "unit": (d.get("attribution") or {}).get("unit"),
             "outliers": len((d.get("attribution") or {}).get("outliers") or [])}
            for d in pred.get("devices") or []]
        rec["prediction_notes"] = pred.get("notes")
        rec["gentle_capacity_bytes"] = (gentle or {}).get("capacity_bytes")
        rec["gentle_requests_seen"] = ((gentle or {}).get("requests") or {}).get("total")
    except Exception as e:
        rec["gentle_error"] = "%s: %s" % (type(e).__name__, e)
    save(out, rec)
    # 2. the ramp, stopping at the first OOM
    try:
        svc = Service(table, name, os.path.join(out, "ramp_service.log"), fake=fake)
        try:
            args = ["--ramp-until-oom", "--step-duration", "6s" if not fake else "2s"]
            pf = os.path.join(out, "gentle", "results.json")
            if os.path.exists(pf):
                args += ["--predicted-from", pf]
            ramp, rc, err = vramroom(hr, svc, tmpl, args, os.path.join(out, "ramp"),
                                     TIMEOUTS["ramp"])
            rec["ramp_rc"], rec["ramp_err"] = rc, err
        finally:
            svc.stop()
        obs = ((((ramp or {}).get("http") or {}).get("prediction") or {}).get("observed")) or {}
        rec["observed"] = obs
        rec["ramp_stop_reason"] = (ramp or {}).get("stop_reason")
        rec["ramp_stages"] = [
            {"concurrency": s.get("concurrency"), "ok": s["requests"].get("ok"),
             "oom": s["requests"].get("oom"), "other": s["requests"].get("other_errors"),
             "peak_reserved": s.get("peak_reserved_bytes")}
            for s in (ramp or {}).get("stages") or []]
    except Exception as e:
        rec["ramp_error"] = "%s: %s" % (type(e).__name__, e)
    save(out, rec)
    # 3. the expandable_segments rerun of the same request sequence
    try:
        conf = "expandable_segments:True"
        svc = Service(table, name, os.path.join(out, "expandable_service.log"), conf, fake=fake)
        try:
            exp, rc, err = vramroom(hr, svc, tmpl, ["-c", "1", "-n", str(n)],
                                    os.path.join(out, "expandable"), TIMEOUTS["expandable"])
            rec["expandable_rc"], rec["expandable_err"] = rc, err
            real = svc.metric("torch_cuda_max_memory_reserved_bytes")
        finally:
            svc.stop()
        pred_peak = what_if_peak(gentle, conf)
        rec["expandable_real_max_reserved"] = real
        rec["expandable_whatif_peak_reserved"] = pred_peak
        rec["default_whatif_peak_reserved"] = what_if_peak(gentle, "")
        if real and pred_peak:
            rec["expandable_error_pct"] = round((pred_peak - real) / real * 100, 2)
    except Exception as e:
        rec["expandable_error"] = "%s: %s" % (type(e).__name__, e)
    rec["done"] = True
    save(out, rec)
    return rec


def main():
    hr, root = sys.argv[1], sys.argv[2]
    fake = "--fake" in sys.argv
    table = FAKE if fake else SERVICES
    only = (sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv
            else list(table))
    os.makedirs(root, exist_ok=True)
    recs = {n: {"service": n} for n in only}

    def run(n):
        try:
            one(hr, table, n, root, fake, recs[n])
        except Exception as e:  # one service failing does not stop the others
            recs[n]["error"] = "%s: %s" % (type(e).__name__, e)

    ts = [threading.Thread(target=run, args=(n,), daemon=True) for n in only]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(1.0, DEADLINE_S - (time.time() - t0)))
    for n, t in zip(only, ts):
        if t.is_alive():
            recs[n]["error"] = "still running at the %ds deadline: partial record" % DEADLINE_S
    with open(os.path.join(root, "run_c.jsonl"), "w") as f:
        for n in only:
            f.write(json.dumps(recs.get(n)) + "\n")
    print("%-7s %10s %10s %8s %7s %12s %12s %8s" % (
        "service", "predicted", "observed", "last ok", "agrees", "exp what-if", "exp real",
        "exp err%"))
    for n in only:
        r = recs.get(n) or {}
        o = r.get("observed") or {}
        print("%-7s %10s %10s %8s %7s %12s %12s %8s" % (
            n, r.get("predicted_first_oom"), o.get("first_oom_concurrency"),
            o.get("last_ok_concurrency"), o.get("agrees"),
            r.get("expandable_whatif_peak_reserved"), r.get("expandable_real_max_reserved"),
            r.get("expandable_error_pct")))
        for k in ("error", "gentle_error", "ramp_error", "expandable_error"):
            if r.get(k):
                print("  %s: %s" % (k, r[k]))
    sys.stdout.flush()
    os._exit(0)  # threads past the deadline (and their services) do not hold the exit


if __name__ == "__main__":
    main()
