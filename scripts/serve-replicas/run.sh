#!/usr/bin/env bash
# vramroom serve with one replica per --device entry, under vramroom http at the load one
# replica sheds at and at 4x it: counts answers by status, and reads each replica's OOM
# counter, peak and placed requests from /metrics.
#
#   DEVICE=cpu,cpu bash scripts/serve-replicas/run.sh            # two simulated devices (CPU)
#   DEVICE=cuda:0 CAPACITY=2GiB bash scripts/serve-replicas/run.sh   # one GPU, same code
#   DEVICE=cuda:0,cuda:1 CAPACITY=2GiB bash scripts/serve-replicas/run.sh   # two GPUs
#
# Env: DEVICE, MODEL (zoo-gpt-tiny), CAPACITY (8MiB), MARGIN (7880KiB: room for a few
# requests), C1 (24: a load one replica sheds at, see the -c C1 line of a DEVICE=cpu run;
# the second run is 4x it), DURATION (10s), OUT (out/serve-replicas/<device>), VRAMROOM (the binary;
# default target/release/vramroom, or $CARGO_TARGET_DIR/release/vramroom).
# Pass: every answer is 200 or 503 (exit of this script 0), num_ooms 0 on every replica,
# each replica's max allocated <= its admission limit, every replica placed > 0 requests.
set -euo pipefail
DEVICE=${DEVICE:-cpu,cpu}
MODEL=${MODEL:-gpt2-tiny}
CAPACITY=${CAPACITY:-8MiB}
MARGIN=${MARGIN:-7880KiB}
C1=${C1:-24}
DURATION=${DURATION:-10s}
OUT=${OUT:-out/serve-replicas/${DEVICE//[:,]/_}}
VRAMROOM=${VRAMROOM:-${CARGO_TARGET_DIR:-target}/release/vramroom}
mkdir -p "$OUT"

"$VRAMROOM" serve --model "$MODEL" --device "$DEVICE" --capacity "$CAPACITY" --margin "$MARGIN" \
  --max-latency off --max-batch 2 --port 0 >"$OUT/serve.stdout" 2>"$OUT/serve.stderr" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q "listening on" "$OUT/serve.stdout" 2>/dev/null && break
  kill -0 $PID 2>/dev/null || { cat "$OUT/serve.stderr"; exit 1; }
  sleep 0.1
done
URL=$(sed -n 's/^listening on //p' "$OUT/serve.stdout")
echo "server $URL ($DEVICE)"; cat "$OUT/serve.stderr"

fail=0
for c in "$C1" $((4 * C1)); do
  "$VRAMROOM" http "$URL/v1/infer" -c "$c" -z "$DURATION" -H 'Content-Type: application/json' \
    -d '{"inputs": [{{rand_ints 24..30 0 29}}]}' --metrics-url "$URL/metrics" \
    --out "$OUT/c$c" --json >"$OUT/c$c.json" || true
  python3 - "$OUT/c$c.json" "$c" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
codes = r["http"]["status_codes"]
print(f"-c {sys.argv[2]}: answers by status {codes}, service OOMs {r['http']['service_ooms']}")
if r["http"]["service_ooms"]:
    sys.exit(1)
bad = {k: v for k, v in codes.items() if str(k) not in ("200", "503")}
if bad:
    print("answers other than 200/503:", bad); sys.exit(1)
PY
done
curl -s "$URL/metrics" >"$OUT/metrics.txt"
curl -s "$URL/healthz" >"$OUT/healthz.json"
python3 - "$OUT/metrics.txt" <<'PY' || fail=1
import re, sys
m = open(sys.argv[1]).read()
def series(name):
    out = {}
    for line in m.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            s, v = line.rsplit(" ", 1)
            dev = re.search(r'device="([^"]*)"', s)
            if name == "vramroom_requests_total":
                code = re.search(r'code="(\d+)"', s).group(1)
                out[(dev.group(1) if dev else "-", code)] = float(v)
            else:
                out[dev.group(1) if dev else "-"] = float(v)
    return out
ooms, peak, limit = series("vramroom_num_ooms_total"), series("vramroom_max_memory_allocated_bytes"), series("vramroom_admission_limit_bytes")
placed, codes = series("vramroom_replica_requests_total"), series("vramroom_requests_total")
if list(limit) == ["-"]:  # one replica: unlabelled series, the router's count labelled
    placed = {"-": sum(placed.values())}
ok = True
for d in sorted(limit):
    print(f"{d}: placed {placed.get(d, 0):.0f}, ooms {ooms[d]:.0f}, peak {peak[d]:.0f} <= limit {limit[d]:.0f}")
    ok &= ooms[d] == 0 and peak[d] <= limit[d]
ok &= all(v > 0 for v in placed.values())
print("answers by (device, code):", {f"{k[0]} {k[1]}": int(v) for k, v in sorted(codes.items())})
ok &= all(k[1] in ("200", "503") for k, v in codes.items() if v > 0)
print("PASS" if ok else "FAIL"); sys.exit(0 if ok else 1)
PY
kill -TERM $PID; wait $PID || true; trap - EXIT
tail -1 "$OUT/serve.stderr"
exit $fail
