"""Device run d (issue 32): predicted against observed first OOM on a corpus of services.

    python3 scripts/services/collect_d.py VRAMROOM_BIN WORK_DIR OUT_DIR [--only a,b] [--fake]

For every service of SERVICES, all in parallel on the one GPU, each step on a fresh service
process (nothing carries over but the numbers named here):

0. calibrate: the service under a generous 6 GiB cap serves CAL_N requests of its own body
   template, one at a time, and one request at its largest size. From the probe: what the
   model holds (reserved after the load) and the largest request's own peak (max allocated
   less the load's). The memory cap of every later step is load + K x that peak x 1.15,
   rounded up to 64 MiB and kept within 1-4 GiB, so that the service runs out at a modest
   concurrency (about K of the largest requests; more of the average ones). The cap is the
   experiment's setting, not an observation: it is written down before anything is
   predicted or observed, and the same for every later step.
1. gentle: `vramroom http --predict -c 1 -n N` (one request at a time: at most a quarter of
   the K the cap was sized for, checked again against the observed OOM), with the other
   allocator config as `--what-if` and `--target-concurrency 2K` (above the OOM point, so
   the size cap has work to do). The step of the ramps is set from this run: 2.5 x its
   slowest request, kept within STEP_MIN-STEP_MAX seconds; the ramp also holds a step past
   its duration until as many of its own requests are back as it has workers, so the
   longest request overlaps itself at every step.
2. ramp 1, 2, 3: `vramroom http --ramp-until-oom --predicted-from gentle/results.json`
   over the default ramp's steps from 2 to 64 (`--stages`, step_s each), each on a fresh
   service (its probe's ring fixed small: the ramps use no trace), stopping at the first OOM (a 507 naming a CUDA OOM, or the probe's
   OOM counter rising). In the order ramp 1, the what-if ramp, the size cap, ramp 2, ramp 3,
   so a short budget keeps the most telling steps. Where five ramps one after another do
   not fit the budget (generate()'s long requests), they run in up to five lanes (RUN_D_MAX_LANES) side by
   side, each ramp still on a fresh service of its own (rec["lanes"] says which).
3. what-if: the service restarted under the other config (expandable_segments:True, or for
   the service that sets it itself, expandable_segments:False, the default) and ramped
   once: observed first OOM against the gentle run's prediction for that config.
4. size cap: when the gentle run printed one, a ramp up to the target concurrency with
   bodies no larger than the cap (the service's CAP_TEMPLATE): no OOM at or below the
   target is the cap verified.

Verdict per ramp: the prediction within one step of the observed first OOM, steps being the
default ramp 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192 (a prediction's step is the
first step at or above it). Spread: the three ramps' first OOMs (min, max, and steps apart).

Timeouts: each service's pipeline stops starting steps after SERVICE_BUDGET_S (a step is
skipped, and said so, when the time left is below its estimate), every vramroom call is
interrupted (SIGINT: it writes what it has) at its share of the time left, and the whole
collection writes its results by DEADLINE_S whatever still runs. Every step's record is
written as it lands: OUT_DIR/run_d.jsonl is rewritten after each step.

--fake runs the same pipeline on CPU against fake_service.py on the torch stub (one
instance per FAKE entry: a service that runs out at a known concurrency; one whose tags say
nothing about its cost): the dry run of gpu_run_d.sh.
"""
import json
import math
import os
import signal
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
GIB = 1 << 30
MIB = 1 << 20
STEPS = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192]
RAMP = STEPS[1:11]  # 2 .. 64
EXPANDABLE = "expandable_segments:True"
DEFAULT_CONF = "expandable_segments:False"

# name: script, body template, largest body, gentle requests, K (the cap holds about K of
# the largest requests), calibration requests, other config, the cap template: a function of
# (unit, cap) giving a body template whose requests stay within the cap (None: none).


def _bert_cap(unit, cap):
    if unit == "tokens":
        b = max(1, min(32, cap // 512))
        return '{"batch": {{rand_int 1 %d}}, "length": {{rand_int 16 %d}}}' % (
            b, max(16, min(512, cap // b)))
    if unit == "items":
        return '{"batch": {{rand_int 1 %d}}, "length": {{rand_int 16 512}}}' % max(1, cap)
    return None


def _gen_cap(bmax, pmax, new_lo, new_hi):
    def f(unit, cap):
        if unit == "tokens":
            per = max(1, cap // max(1, bmax))  # prompt + new per sequence
            p = max(16, min(pmax, per - new_hi))
            b = max(1, min(bmax, cap // (p + new_hi)))
            return ('{"batch": {{rand_int 1 %d}}, "prompt": {{rand_int 16 %d}}, '
                    '"new": {{rand_int %d %d}}}' % (b, p, new_lo, new_hi))
        if unit == "items":
            return ('{"batch": {{rand_int 1 %d}}, "prompt": {{rand_int 16 %d}}, '
                    '"new": {{rand_int %d %d}}}' % (max(1, min(bmax, cap)), pmax, new_lo, new_hi))
        return None
    return f


def _resnet_cap(unit, cap):
    return '{"images": {{rand_int 1 %d}}}' % max(1, cap) if unit == "items" else None


def _batcher_cap(unit, cap):
    # The tags are per batch (the batcher's): a request's own size cannot be capped by them.
    return None


def _score_cap(unit, cap):
    if unit == "tokens":
        b = max(1, min(4, cap // 512))
        return '{"batch": {{rand_int 1 %d}}, "length": {{rand_int 32 %d}}}' % (
            b, max(32, min(512, cap // b)))
    if unit == "items":
        return '{"batch": {{rand_int 1 %d}}, "length": {{rand_int 32 512}}}' % max(1, min(4, cap))
    return None


def _two_cap(unit, cap):
    if unit == "tokens":
        b = max(1, min(16, cap // 256))
        return ('{"batch": {{rand_int 1 %d}}, "length": {{rand_int 16 %d}}, '
                '"images": {{rand_int 1 32}}}' % (b, max(16, min(256, cap // b))))
    if unit == "items":
        return ('{"batch": {{rand_int 1 16}}, "length": {{rand_int 16 256}}, '
                '"images": {{rand_int 1 %d}}}' % max(1, min(32, cap)))
    return None


def _fake_cap(unit, cap):
    return '{"k": {{rand_int 1 %d}}}' % max(1, cap) if unit == "items" else None


GEN_SHORT = ('{"batch": {{rand_int 1 8}}, "prompt": {{rand_int 16 256}}, '
             '"new": {{rand_int 8 32}}}')
GEN_LONG = ('{"batch": {{rand_int 1 8}}, "prompt": {{rand_int 64 512}}, '
            '"new": {{rand_int 64 128}}}')
LLAMA = ('{"batch": {{rand_int 1 16}}, "prompt": {{rand_int 64 1024}}, '
         '"new": {{rand_int 16 48}}}')

SERVICES = {
    "bert": dict(script="bert_encoder.py",
                 tmpl='{"batch": {{rand_int 1 32}}, "length": {{rand_int 16 512}}}',
                 big='{"batch": 32, "length": 512}', n=120, k=6, cal=6,
                 cap=_bert_cap, what="BERT-base encoder, fp32, batch 1-32 x 16-512 tokens"),
    "resnet": dict(script="resnet_batch.py", tmpl='{"images": {{rand_int 1 48}}}',
                   big='{"images": 48}', n=120, k=6, cal=6, cap=_resnet_cap,
                   what="ResNet-50, fp32, 1-48 images of 224x224"),
    "gpt2_short": dict(script="gpt2_generate.py", tmpl=GEN_SHORT,
                       big='{"batch": 8, "prompt": 256, "new": 32}', n=40, k=3, cal=3,
                       cap=_gen_cap(8, 256, 8, 32),
                       what="GPT-2 generate(), KV cache, batch 1-8, prompt 16-256, 8-32 new"),
    "gpt2_long": dict(script="gpt2_generate.py", tmpl=GEN_LONG,
                      # k=2: long requests slow down with every one in flight (the GIL, the
                      # GPU), so the cap makes it run out early in the ramp.
                      big='{"batch": 8, "prompt": 512, "new": 128}', n=20, k=2, cal=2,
                      cap=_gen_cap(8, 512, 64, 128),
                      what="GPT-2 generate(), KV cache, batch 1-8, prompt 64-512, 64-128 new"),
    "llama": dict(script="llama_generate.py", tmpl=LLAMA,
                  big='{"batch": 16, "prompt": 1024, "new": 48}', n=30, k=3, cal=3,
                  cap=_gen_cap(16, 1024, 16, 48),
                  what="Llama (8 layers, hidden 1024, GQA, bf16) generate(), batch 1-16, prompt 64-1024, 16-48 new"),
    "batcher": dict(script="batcher_encoder.py",
                    tmpl='{"n": {{rand_int 1 8}}, "length": {{rand_int 16 512}}}',
                    # k=2: the cap holds two of the largest requests (16 sequences), half
                    # a full batch: it runs out once enough requests wait to fill one.
                    big='{"n": 8, "length": 512}', n=120, k=2, cal=6, cap=_batcher_cap,
                    what="BERT-base fp16 behind its own queue + batcher thread (<= 32 seqs, 5 ms)"),
    "expandable": dict(script="gpt2_score_expandable.py",
                       tmpl='{"batch": {{rand_int 1 4}}, "length": {{rand_int 32 512}}}',
                       big='{"batch": 4, "length": 512}', n=100, k=6, cal=6, cap=_score_cap,
                       own=EXPANDABLE,
                       what="GPT-2 scoring (fp32 logits, log_softmax), expandable_segments:True"),
    "empty_cache": dict(script="encoder_empty_cache.py",
                        tmpl='{"batch": {{rand_int 1 32}}, "length": {{rand_int 16 512}}}',
                        big='{"batch": 32, "length": 512}', n=120, k=6, cal=6, cap=_bert_cap,
                        what="6-layer BERT, fp32, empty_cache() after each request"),
    "two_models": dict(script="two_models.py",
                       tmpl=('{"batch": {{rand_int 1 16}}, "length": {{rand_int 16 256}}, '
                             '"images": {{rand_int 1 32}}}'),
                       big='{"batch": 16, "length": 256, "images": 32}', n=120, k=6, cal=6,
                       cap=_two_cap,
                       what="BERT-small text + ResNet-18 image models, fp16, one GPU, one request runs both"),
}
FAKE = {
    # 64 MiB model, k x 20 MiB per request: calibration sizes the cap for ~K of the largest.
    "fake": dict(script="fake_service.py", tmpl='{"k": {{rand_int 1 4}}}', big='{"k": 4}',
                 n=40, k=4, cal=4, cap=_fake_cap, what="stub: k x 20 MiB, tagged items=k"),
    "fake_bytes": dict(script="fake_service.py",
                       tmpl='{"k": {{rand_int 1 4}}, "pad": "{{tokens 1..300}}"}',
                       big='{"k": 4}', n=40, k=4, cal=4, cap=_fake_cap,
                       env={"FAKE_MODE": "bytes"},
                       what="stub: k x 20 MiB, only the body's bytes tagged (unrelated to k)"),
    "fake_slow": dict(script="fake_service.py", tmpl='{"k": {{rand_int 1 4}}}', big='{"k": 4}',
                      n=12, k=4, cal=2, cap=_fake_cap, env={"FAKE_SLEEP_S": "0.6"},
                      what="stub: k x 20 MiB held 0.6 s (a long request, as generate())"),
    "fake_exp": dict(script="fake_service.py", tmpl='{"k": {{rand_int 1 4}}}', big='{"k": 4}',
                     n=40, k=4, cal=4, cap=_fake_cap, own=EXPANDABLE,
                     env={"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE},
                     what="stub under expandable_segments:True (the stub ignores it)"),
}

CAL_GIB = 6.0
RAMP_MAX_ENTRIES = 20000
CAP_MIN_GIB, CAP_MAX_GIB = 1.0, 4.0
STEP_MIN, STEP_MAX = 5.0, 15.0
# Ramps side by side at most (each its own service process and cap): five lets all five of
# a generate() service's ramps run at once when one after another would not fit.
MAX_LANES = int(os.environ.get("RUN_D_MAX_LANES", "5"))
# RUN_D_BUDGET_S / RUN_D_DEADLINE_S shrink them to rehearse the skips and interruptions.
# A step in flight at the budget is interrupted within ~35 s: every pipeline ends by ~475 s
# (under 8 minutes); the collection writes everything at DEADLINE_S whatever still runs.
SERVICE_BUDGET_S = float(os.environ.get("RUN_D_BUDGET_S", 440))
DEADLINE_S = float(os.environ.get("RUN_D_DEADLINE_S", 490))
START_TIMEOUT_S = 150
FAKE_SCALE = {"STEP_MIN": 1.5, "STEP_MAX": 3.0}

_live = set()
PIDS = None  # WORK_DIR/pids: every service's process group
_live_lock = threading.Lock()
_t0 = time.time()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Service:
    """One service process: started, waited for ("ready"), scraped, killed."""

    def __init__(self, spec, log_path, cap_gib, conf=None, fake=False, extra=()):
        self.port, self.probe = free_port(), free_port()
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.update(spec.get("env") or {})
        if conf is not None:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        env["PYTHONPATH"] = os.pathsep.join(
            ([STUB] if fake else []) + [os.path.join(REPO, "python")]
            + [p for p in [env.get("PYTHONPATH")] if p])
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, spec["script"]), "--port", str(self.port),
             "--probe-port", str(self.probe), "--cap-gib", "%.4f" % cap_gib] + list(extra),
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
            start_new_session=True)
        with _live_lock:
            _live.add(self)
            if PIDS:
                with open(PIDS, "a") as f:  # for the shell, should this process be killed
                    f.write("%d\n" % self.p.pid)
        box = []
        t = threading.Thread(target=lambda: box.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(START_TIMEOUT_S)
        if not box or box[0].strip() != "ready":
            self.stop()
            raise RuntimeError("service did not start (see %s): %r" % (log_path, box))
        self.url = "http://127.0.0.1:%d/infer" % self.port
        self.metrics = "http://127.0.0.1:%d/metrics" % self.probe

    def scrape(self):
        try:
            with urllib.request.urlopen(self.metrics, timeout=60) as r:
                text = r.read().decode()
        except Exception:
            return {}
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                v = float(line.rsplit(" ", 1)[-1])
            except ValueError:
                continue
            if name == "torch_cuda_memory_stats":
                continue
            out[name] = out.get(name, 0.0) + v
        return out

    def stop(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except Exception:
            pass
        try:
            self.p.wait(timeout=30)
        except Exception:
            pass
        try:
            self.log.close()
        except Exception:
            pass
        with _live_lock:
            _live.discard(self)


def vramroom(hr, svc, tmpl, args, out, timeout):
    """Runs `vramroom http` against svc; at `timeout` it is interrupted (SIGINT: it writes
    what it has), then killed 20 s later. Returns (results dict or None, rc, stderr tail)."""
    cmd = [hr, "http", svc.url, "-m", "POST", "-H", "Content-Type: application/json", "-d", tmpl,
           "--metrics-url", svc.metrics, "--timeout", "60s", "--out", out, "--json", "--quiet",
           "--seed", SEED] + args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    note = ""
    try:
        so, se = p.communicate(timeout=max(5, timeout))
    except subprocess.TimeoutExpired:
        note = "interrupted at %ds; " % timeout
        p.send_signal(signal.SIGINT)
        try:
            so, se = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            note = "killed at %ds; " % (timeout + 20)
    res = None
    try:
        res = json.loads(so)
    except ValueError:
        f = os.path.join(out, "results.json")
        if os.path.exists(f):
            try:
                with open(f) as fh:
                    res = json.load(fh)
            except ValueError:
                pass
    return res, p.returncode, note + (se or "")[-1200:]


def step_index(c):
    """The ramp step a concurrency lands in: the first step at or above it."""
    if c is None:
        return None
    for i, s in enumerate(STEPS):
        if s >= c:
            return i
    return len(STEPS)


def verdict(pred, obs, top=None):
    """(steps apart, within one step) of a prediction and an observed first OOM. `None` on
    either side is "no OOM": predicted for any load (a service whose one worker thread runs
    every request), or observed up to the ramp's highest step `top`, so the first OOM, if
    any, is at a later step. No OOM predicted agrees with a ramp that reached the default
    ramp's top without one. A predicted OOM two or more steps below a ramp's highest step
    that saw none is off; nearer, the ramp (cut short, or ended at its top) cannot tell:
    `None`, not a pass."""
    if obs is not None:
        if pred is None:
            return None, False
        apart = step_index(pred) - step_index(obs)
        return apart, abs(apart) <= 1
    if top is None:
        return None, None
    if pred is None:
        return (0, True) if top >= RAMP[-1] else (None, None)
    # the first OOM is at step_index(top) + 1 or later
    return (None, False) if step_index(pred) < step_index(top) else (None, None)


def summarise(rec):
    """A service record's summary of its ramps: the observed first OOMs, their spread, and
    how many ramps the prediction is within one step of (all: a definite miss outweighs an
    undecided ramp)."""
    ramps = rec.get("ramps") or []
    firsts = [r.get("first_oom") for r in ramps]
    seen = [f for f in firsts if f is not None]
    rec["observed_first_ooms"] = firsts
    rec["observed_min"] = min(seen) if seen else None
    rec["observed_max"] = max(seen) if seen else None
    rec["spread_steps"] = (step_index(max(seen)) - step_index(min(seen))) if seen else None
    v = [r.get("within_one_step") for r in ramps]
    rec["within_one_step_all"] = (all(v) if v and None not in v else
                                  (False if False in v else None))
    rec["within_one_step_count"] = "%d/%d" % (sum(1 for x in v if x), len(v))
    mn = rec["observed_min"]
    top = max((r.get("highest_step") or 0 for r in ramps), default=0)
    # the gentle run's one request at a time is at most a quarter of the first OOM
    # (or of the highest step a ramp reached without one)
    rec["gentle_quarter_ok"] = (4 * 1 <= mn) if mn is not None else (4 * 1 <= top)


def judge(rec):
    """Every ramp's verdict again, from its stored prediction and observation, by the rule
    as it stands (a record keeps the verdicts of the rule it ran under), then the summary."""
    for r in (rec.get("ramps") or []) + [rec.get("what_if_ramp") or {}]:
        if "predicted" in r:
            r["steps_apart"], r["within_one_step"] = verdict(
                r.get("predicted"), r.get("first_oom"), r.get("highest_step"))
    summarise(rec)


class Pipeline:
    def __init__(self, hr, name, spec, root, fake, rec, flush):
        self.hr, self.name, self.spec, self.fake, self.rec = hr, name, spec, fake, rec
        self.out = os.path.join(root, name)
        os.makedirs(self.out, exist_ok=True)
        self.flush = flush
        self.t0 = time.time()
        self.own = spec.get("own", "")
        self.other = DEFAULT_CONF if self.own == EXPANDABLE else EXPANDABLE
        self.step_min = FAKE_SCALE["STEP_MIN"] if fake else STEP_MIN
        self.step_max = FAKE_SCALE["STEP_MAX"] if fake else STEP_MAX
        self.lock = threading.Lock()  # the lanes share rec

    def left(self):
        return SERVICE_BUDGET_S - (time.time() - self.t0)

    def save(self):
        with open(os.path.join(self.out, "record.json"), "w") as f:
            json.dump(self.rec, f)
        self.flush()

    def service(self, tag, conf=None, cap=None, extra=()):
        return Service(self.spec, os.path.join(self.out, tag + "_service.log"),
                       cap if cap is not None else self.rec["cap_gib"], conf, self.fake, extra)

    def calibrate(self):
        t = time.time()
        svc = self.service("calibrate", cap=CAL_GIB)
        try:
            m0 = svc.scrape()
            base_alloc = m0.get("torch_cuda_memory_allocated_bytes", 0.0)
            base_res = m0.get("torch_cuda_memory_reserved_bytes", 0.0)
            r1, rc1, e1 = vramroom(self.hr, svc, self.spec["tmpl"],
                                   ["-c", "1", "-n", str(self.spec["cal"]), "--no-probe"],
                                   os.path.join(self.out, "calibrate"), min(120, self.left()))
            r2, rc2, e2 = vramroom(self.hr, svc, self.spec["big"], ["-c", "1", "-n", "1", "--no-probe"],
                                   os.path.join(self.out, "calibrate_big"), min(90, self.left()))
            m1 = svc.scrape()
        finally:
            svc.stop()
        peak = m1.get("torch_cuda_max_memory_allocated_bytes", 0.0) - base_alloc
        lat = max((r or {}).get("latency", {}).get("max_ms", 0.0) for r in (r1, r2))
        ok = ((r1 or {}).get("requests") or {}).get("ok", 0)
        k = self.spec["k"]
        want = base_res + k * max(peak, 1) * 1.15
        cap = math.ceil(want / (64 * MIB)) * 64 * MIB / GIB
        cap = min(CAP_MAX_GIB, max(0.25 if self.fake else CAP_MIN_GIB, cap))
        self.rec.update({
            "calibrate_s": round(time.time() - t, 1), "calibrate_ok": ok,
            "calibrate_errors": None if ok else (e1 + e2)[-600:],
            "load_reserved_bytes": int(base_res), "largest_request_peak_bytes": int(peak),
            "largest_request_ms": lat, "cap_gib": round(cap, 4),
            "cap_holds_largest": round((cap * GIB - base_res) / max(peak, 1), 2),
        })
        if not ok or peak <= 0:
            raise RuntimeError("calibration saw no request succeed: %s" % (e1 + e2)[-400:])

    def gentle(self):
        t = time.time()
        svc = self.service("gentle")
        target = 2 * self.spec["k"]
        try:
            args = ["-c", "1", "-n", str(self.spec["n"]), "--predict", "--target-concurrency",
                    str(target), "--what-if", self.other]
            res, rc, err = vramroom(self.hr, svc, self.spec["tmpl"], args,
                                    os.path.join(self.out, "gentle"), min(200, self.left() - 60))
            probe_m = svc.scrape()
        finally:
            svc.stop()
        pred = ((res or {}).get("http") or {}).get("prediction") or {}
        devs = pred.get("devices") or []
        lat = ((res or {}).get("latency") or {}).get("max_ms") or self.rec.get("largest_request_ms") or 0
        step = min(self.step_max, max(self.step_min, 2.5 * lat / 1e3))
        self.rec.update({
            "gentle_s": round(time.time() - t, 1), "gentle_rc": rc, "gentle_err": err[-600:],
            "gentle_concurrency": 1, "gentle_requests_sent": ((res or {}).get("requests") or {}).get("total"),
            "gentle_max_latency_ms": lat, "step_s": round(step, 1),
            "target_concurrency": target,
            "predicted_first_oom": pred.get("first_oom_concurrency"),
            "predicted_by_config": {},
            "devices": [],
            "prediction_notes": pred.get("notes") or [],
            "probe_history": {k: probe_m.get(k) for k in (
                "vramroom_probe_history_max_entries", "vramroom_probe_history_events",
                "vramroom_probe_history_wrapped", "vramroom_probe_requests_total")},
            "what_if_peak_reserved": {(w.get("alloc_conf") or "default"): w.get("peak_reserved_bytes")
                                      for w in (res or {}).get("what_if") or []},
        })
        for d in devs:
            a = d.get("attribution") or {}
            cap = d.get("size_cap") or {}
            self.rec["devices"].append({
                "device": d.get("device"), "limit_bytes": d.get("limit_bytes"),
                "requests": d.get("requests"), "tagged": d.get("tagged"),
                "configs": {(c.get("alloc_conf") or "default"): c.get("first_oom_concurrency")
                            for c in d.get("configs") or []},
                "size_cap": cap or None, "unit": a.get("unit"),
                "bytes_per_unit": a.get("bytes_per_unit"),
                "intercept_bytes": a.get("intercept_bytes"),
            })
            for c in d.get("configs") or []:
                key = c.get("alloc_conf") or "default"
                v = c.get("first_oom_concurrency")
                old = self.rec["predicted_by_config"].get(key)
                self.rec["predicted_by_config"][key] = v if old is None else min(old, v or old)
        self.rec["prediction_requests"] = min((d.get("requests") or 0 for d in devs), default=0)
        ok = ((res or {}).get("requests") or {}).get("ok", 0)
        if not ok:
            raise RuntimeError("the gentle run had no request succeed: %s" % err[-400:])

    def ramp(self, tag, conf=None, tmpl=None, stages=None, predicted=None):
        """One ramp on a fresh service: its record (first OOM, last ok, stages)."""
        t = time.time()
        r = {"tag": tag, "conf": conf if conf is not None else (self.own or "default")}
        # The ramps use no trace: a small fixed ring keeps the probe's snapshot at the OOM
        # (which it takes inside the failing request) quick; the allocations are the same.
        svc = self.service(tag, conf=conf, extra=["--max-entries", str(RAMP_MAX_ENTRIES)])
        try:
            args = ["--ramp-until-oom", "--no-probe"]
            # The default ramp from its second step (the gentle run was the first): every
            # step lasts step_s, and is held until as many of its requests are back as it
            # has workers.
            args += ["--stages", stages or ",".join(
                "%d:%.1fs" % (c, self.rec["step_s"]) for c in RAMP)]
            pf = os.path.join(self.out, "gentle", "results.json")
            if os.path.exists(pf) and conf is None and tmpl is None:
                args += ["--predicted-from", pf]
            res, rc, err = vramroom(self.hr, svc, tmpl or self.spec["tmpl"], args,
                                    os.path.join(self.out, tag), max(10, self.left() - 5))
            ooms = svc.scrape().get("vramroom_probe_ooms_total")
        finally:
            svc.stop()
        obs = ((((res or {}).get("http") or {}).get("prediction") or {}).get("observed")) or {}
        stages_ = [{"c": s.get("concurrency"), "ok": (s.get("requests") or {}).get("ok"),
                    "oom": (s.get("requests") or {}).get("oom"),
                    "other": (s.get("requests") or {}).get("other_errors"),
                    "s": round((s.get("end_s") or 0) - (s.get("start_s") or 0), 1),
                    "peak_reserved": s.get("peak_reserved_bytes")}
                   for s in (res or {}).get("stages") or []]
        first = obs.get("first_oom_concurrency")
        r.update({"s": round(time.time() - t, 1), "rc": rc, "err": err[-400:] if rc else "",
                  "stop_reason": (res or {}).get("stop_reason"), "first_oom": first,
                  "last_ok": obs.get("last_ok_concurrency"), "service_ooms": ooms,
                  "highest_step": max((s["c"] or 0 for s in stages_), default=None),
                  "stages": stages_})
        if tag.startswith("ramp") or conf is not None:
            r["predicted"] = predicted
            r["steps_apart"], r["within_one_step"] = verdict(predicted, first, r["highest_step"])
        return r

    def run(self):
        self.rec.update({"service": self.name, "what": self.spec["what"],
                         "own_config": self.own or "default", "other_config": self.other,
                         "ramps": [], "what_if_ramp": None, "cap_ramp": None, "skipped": []})
        self.calibrate()
        self.save()
        self.gentle()
        self.save()
        pred = self.rec.get("predicted_first_oom")
        est = 7 * self.rec["step_s"] + 20.0  # a ramp to the 7th step, with its service start
        # Five ramps (three, the what-if, the size cap) one after another do not fit the
        # budget where requests are long (generate()): they run in lanes, each ramp on its
        # own service process as before, so the GPU and the cores are shared. Memory is
        # per process (each has its own cap), so a ramp's first OOM does not depend on the
        # lanes beside it; only latencies do, and a step is held until its requests overlap.
        n_lanes = max(1, min(MAX_LANES, math.ceil(5 * est / max(1.0, 0.8 * (self.left() - 10)))))
        order = [("ramp1", None), ("whatif", self.other), ("cap", "cap"), ("ramp2", None),
                 ("ramp3", None)]
        lanes = [order[i::n_lanes] for i in range(n_lanes)]
        self.rec["lanes"] = [[t for t, _ in lane] for lane in lanes]
        box = {"est": est}

        def lane(steps):
            for tag, conf in steps:
                if tag == "cap":
                    self.cap_ramp(box["est"])
                    continue
                if self.left() < box["est"]:
                    with self.lock:
                        self.rec["skipped"].append("%s: %.0fs left, a ramp took %.0fs" % (
                            tag, self.left(), box["est"]))
                    continue
                try:
                    if conf is None:
                        r = self.ramp(tag, predicted=pred)
                        with self.lock:
                            self.rec["ramps"].append(r)
                            self.rec["ramps"].sort(key=lambda x: x["tag"])
                    else:
                        p2 = (self.rec.get("predicted_by_config") or {}).get(conf)
                        r = self.ramp(tag, conf=conf, predicted=p2)
                        with self.lock:
                            self.rec["what_if_ramp"] = r
                    box["est"] = max(box["est"] * 0.5, r["s"] + 5)
                except Exception as e:
                    with self.lock:
                        self.rec["skipped"].append("%s: %s: %s" % (tag, type(e).__name__, e))
                with self.lock:
                    self.summarise()
                    self.save()

        ts = [threading.Thread(target=lane, args=(steps,), daemon=True) for steps in lanes]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.summarise()
        self.rec["done"] = True
        self.rec["pipeline_s"] = round(time.time() - self.t0, 1)
        self.save()

    def cap_ramp(self, est):
        devs = self.rec.get("devices") or []
        cap = (devs[0].get("size_cap") or {}) if devs else {}
        unit, size = cap.get("unit"), cap.get("max_size")
        target = self.rec.get("target_concurrency")
        tmpl = self.spec["cap"](unit, size) if (unit and size) else None
        if not tmpl:
            self.rec["cap_ramp"] = {"skipped": "no size cap printed (%s)" % (
                "unit %s, max %s" % (unit, size) if cap else "none")}
            return
        if self.left() < est:
            with self.lock:
                self.rec["skipped"].append("cap: %.0fs left" % self.left())
            return
        step = self.rec["step_s"]
        st = ",".join("%d:%.1fs" % (c, step) for c in [c for c in STEPS if c < target] + [target])
        try:
            r = self.ramp("cap", tmpl=tmpl, stages=st)
            r["template"] = tmpl
            r["cap"] = {"unit": unit, "max_size": size, "target": target}
            r["verified"] = r.get("first_oom") is None and (r.get("highest_step") or 0) >= target
            with self.lock:
                self.rec["cap_ramp"] = r
        except Exception as e:
            with self.lock:
                self.rec["skipped"].append("cap: %s: %s" % (type(e).__name__, e))

    def summarise(self):
        summarise(self.rec)


def main():
    hr, root, out = sys.argv[1], sys.argv[2], sys.argv[3]
    fake = "--fake" in sys.argv
    table = FAKE if fake else SERVICES
    only = (sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv
            else list(table))
    os.makedirs(root, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    global PIDS
    PIDS = os.path.join(root, "pids")
    recs = {n: {"service": n} for n in only}
    lock = threading.Lock()

    def flush():
        with lock:
            tmp = os.path.join(out, "run_d.jsonl.tmp")
            with open(tmp, "w") as f:
                for n in only:
                    f.write(json.dumps(recs[n], default=str) + "\n")
            os.replace(tmp, os.path.join(out, "run_d.jsonl"))

    def run(n):
        try:
            Pipeline(hr, n, table[n], root, fake, recs[n], flush).run()
        except Exception as e:  # one service failing does not stop the others
            recs[n]["error"] = "%s: %s" % (type(e).__name__, e)
            flush()

    ts = [threading.Thread(target=run, args=(n,), daemon=True) for n in only]
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(1.0, DEADLINE_S - (time.time() - _t0)))
    for n, t in zip(only, ts):
        if t.is_alive():
            recs[n]["error"] = "still running at the %ds deadline: partial record" % DEADLINE_S
    flush()
    with _live_lock:
        left = list(_live)
    for s in left:
        s.stop()
    print(summary_text(recs, only, fake))
    sys.stdout.flush()
    os._exit(0)  # threads past the deadline do not hold the exit


def fmt(v):
    return "-" if v is None else str(v)


def summary_text(recs, only, fake=False):
    lines = ["run d%s: predicted (gentle -c 1) vs observed first OOM, 3 ramps per service" % (
        " (DRY: torch stub)" if fake else ""),
        "%-11s %6s %5s %6s %9s %14s %6s %7s %9s %13s %s" % (
            "service", "cap", "step", "pred", "rests_on", "observed x3", "spread", "1-step",
            "what-if", "(pred/obs)", "size cap")]
    for n in only:
        r = recs.get(n) or {}
        w = r.get("what_if_ramp") or {}
        cr = r.get("cap_ramp") or {}
        cap = ((r.get("devices") or [{}])[0] or {}).get("size_cap") or {}
        capt = ("%s %s @%s: %s" % (cap.get("max_size"), cap.get("unit"), cap.get("target_concurrency"),
                                   {True: "verified", False: "NOT verified", None: "unverified"}[cr.get("verified")])
                if cap.get("max_size") else ("none: " + (cr.get("skipped") or "")))
        lines.append("%-11s %6s %5s %6s %9s %14s %6s %7s %9s %13s %s" % (
            n, fmt(r.get("cap_gib")), fmt(r.get("step_s")), fmt(r.get("predicted_first_oom")),
            "%s/%s" % (fmt(r.get("prediction_requests")), fmt(r.get("gentle_requests_sent"))),
            ",".join(fmt(x) for x in r.get("observed_first_ooms") or []) or "-",
            fmt(r.get("spread_steps")), fmt(r.get("within_one_step_count")),
            (w.get("conf") or "-").replace("expandable_segments:", "exp:")[:12],
            "%s/%s %s" % (fmt(w.get("predicted")), fmt(w.get("first_oom")),
                          {True: "ok", False: "OFF", None: "?"}[w.get("within_one_step")]),
            capt))
        for k in ("error",):
            if r.get(k):
                lines.append("  %s: %s" % (k, r[k]))
        for s in r.get("skipped") or []:
            lines.append("  skipped %s" % s)
        for note in r.get("prediction_notes") or []:
            lines.append("  note: %s" % note)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
