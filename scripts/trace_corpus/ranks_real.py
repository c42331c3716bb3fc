"""Ground truth for `--world-size` on one real GPU: each rank of an N-rank DDP or FSDP2 job,
run alone with that rank's real shapes on PyTorch's fake process group (record_real.py's
RECORD_FAKE_PG), recorded as the corpus programs are. A multi-GPU machine is what the real
check needs; until one is lent this is the one-GPU run of the same per-rank shapes that
issue 30 asks for. NCCL's own buffers are outside the caching allocator either way.

    python3 ranks_real.py --out DIR [--budget S]     # on the GPU, from this folder

DIR/ranks.jsonl (one row per program x world size x rank, record_real.py's row) and
DIR/ranks_snaps.tar.xz. Compared with the tracer by ranks_compare.py (no GPU).
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# (program, its arguments): rank-dependent batches, so the ranks' peaks differ.
JOBS = [("dist_ddp_train", "--batch 256 --batch-step 64"),
        ("dist_fsdp2_train", "--batch 256 --batch-step 64")]
WORLD_SIZES = [2, 4, 8]


def ranks_of(n):
    return sorted({0, n - 1})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=240)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    t0 = time.time()
    rows = []
    for prog, args in JOBS:
        for n in WORLD_SIZES:
            for r in ranks_of(n):
                if time.time() - t0 > a.budget:
                    print("budget spent: %s ws%d r%d not run" % (prog, n, r))
                    continue
                conf = "ws%d_r%d" % (n, r)
                env = dict(os.environ, RECORD_FAKE_PG="1", RANK=str(r), WORLD_SIZE=str(n),
                           LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="29500")
                env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
                log = os.path.join(a.out, "logs", "%s__%s.log" % (prog, conf))
                cmd = [sys.executable, os.path.join(HERE, "record_real.py"), "--one", prog,
                       "--out", a.out, "--conf-name", conf, "--prog-args", args]
                with open(log, "w") as lf:
                    subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, cwd=HERE,
                                   timeout=120)
                row = None
                for line in open(log, errors="replace"):
                    if line.startswith("RESULT "):
                        row = json.loads(line[7:])
                if row is None:
                    row = {"program": prog, "conf": conf,
                           "error": open(log, errors="replace").read()[-400:]}
                row.update({"world_size": n, "rank": r})
                rows.append(row)
                print("%-18s ws%d r%d  alloc %s  reserved %s  %s" % (
                    prog, n, r, row.get("peak_allocated_bytes"), row.get("peak_reserved_bytes"),
                    row.get("error") or ""), flush=True)
    with open(os.path.join(a.out, "ranks.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    with tarfile.open(os.path.join(a.out, "ranks_snaps.tar.xz"), "w:xz") as tar:
        for d in ("snaps", "logs"):
            if os.path.isdir(os.path.join(a.out, d)):
                tar.add(os.path.join(a.out, d), d)


if __name__ == "__main__":
    main()
