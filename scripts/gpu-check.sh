#!/usr/bin/env bash
# Vramroom on a real GPU: the GPU tests, the allocator benchmark against PyTorch's C++
# allocator, ResNet-50 and GPT-2 against PyTorch eager, and PyTorch workloads under
# vramroom_torch against PyTorch's native allocator, and the attention kernels alone against SDPA.
#
#   scripts/gpu-check.sh build   # here (no GPU needed): release builds, copied into devcarry/
#   scripts/gpu-check.sh gpu [--quick] [--only tests,alloc,models,workloads,probe,loadtest,http,hf,attn]
#                                # on the GPU machine, in the repo root, with devcarry/ present
#
# The two halves are one workflow: build here, then send the tree with devcarry/ carried to
# the GPU machine and run the `gpu` half there in one call (the device tool's `run`, with
# carry ["devcarry"] and command `bash scripts/gpu-check.sh gpu`). Everything printed comes
# from this script; results also land in $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRY=$ROOT/devcarry
MODE=${1:-build}
shift || true
QUICK=""
ONLY="tests,alloc,models,workloads,probe,loadtest,http,hf,attn"
while [ $# -gt 0 ]; do
  case "$1" in
  --quick) QUICK="--quick" ;;
  --only) ONLY=$2; shift ;;
  esac
  shift
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }

build() {
  set -e
  local target=${CARGO_TARGET_DIR:-$ROOT/target}
  cargo build --release -p vramroom -p vramroom-torch
  cargo build --release -p vramroom-cuda --example cuda_bench --example attention_bench
  local tests
  tests=$( (cargo test --release -p vramroom-cuda --no-run --message-format=json 2>/dev/null
    cargo test --release -p vramroom-tensor --test cuda --no-run --message-format=json 2>/dev/null) |
    python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"] + "=" + m["executable"])')
  mkdir -p "$CARRY"
  find "$CARRY" -maxdepth 1 -type f -delete
  cp "$target/release/libvramroom_torch.so" "$target/release/vramroom" "$CARRY/"
  cp "$target/release/examples/cuda_bench" "$target/release/examples/attention_bench" "$CARRY/"
  for t in $tests; do cp "${t#*=}" "$CARRY/test-${t%%=*}"; done
  find "$CARRY" -maxdepth 1 -type f -exec strip --strip-debug {} + 2>/dev/null || true
  cp scripts/torch_raw_shim.cpp "$CARRY/"
  # The HTTP client's peers, for `vramroom bench http` on the GPU host's many cores: wrk
  # (with its LuaJIT) and oha, when this machine has them.
  rm -rf "$CARRY/bin" && mkdir -p "$CARRY/bin/lib"
  if command -v wrk >/dev/null; then
    cp "$(command -v wrk)" "$CARRY/bin/"
    ldd "$(command -v wrk)" | awk '/luajit/ {print $3}' | xargs -r -I{} cp {} "$CARRY/bin/lib/"
  fi
  command -v oha >/dev/null && cp "$(command -v oha)" "$CARRY/bin/"
  ls -la "$CARRY"
  du -sh "$CARRY"
  echo "built; now run on the GPU machine: bash scripts/gpu-check.sh gpu   (carry devcarry)"
}

gpu() {
  local R=${OUT:-/tmp/vramroom-gpu}
  mkdir -p "$R"
  export PYTHONUNBUFFERED=1
  # The CUDA libraries PyTorch uses (pip's nvidia-* wheels) are where Vramroom looks too.
  VRAMROOM_PYTHON_SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
  export VRAMROOM_PYTHON_SITE
  export VRAMROOM_CACHE_DIR=/tmp/vramroom-cache
  local T0=$SECONDS
  echo "== machine =="
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
  # The allocator figures are host CPU time: say which CPU.
  lscpu 2>/dev/null | awk -F: '/^Model name|^CPU\(s\)|^L2 cache|^L3 cache/ {gsub(/^ +/, "", $2); printf "%s: %s; ", $1, $2} END {print ""}'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1

  if want tests; then
    echo "== GPU tests (crates/vramroom-cuda/tests, crates/vramroom-tensor/tests/cuda.rs) =="
    : >"$R/tests.log"
    for t in "$CARRY"/test-*; do
      echo "-- ${t##*/}"
      "$t" --test-threads=1 --nocapture --include-ignored 2>&1 | tee -a "$R/tests.log" |
        grep -E "^test |test result|SKIP|device 0:|panicked|FAILED|cpu .* vs cuda" || true
    done
    echo "   ($((SECONDS - T0)) s)"
  fi

  if want alloc; then
    echo "== allocator benchmark =="
    local TORCH_DIR CUDA_INC SHIM=""
    TORCH_DIR=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
    for d in "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/../include" /usr/local/cuda/include \
      "$TORCH_DIR/../nvidia/cu13/include" "$TORCH_DIR/../nvidia/cuda_runtime/include"; do
      if [ -f "$d/cuda_runtime_api.h" ]; then CUDA_INC=$d; break; fi
    done
    local ABI
    ABI=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
    if [ -n "${CUDA_INC:-}" ] && g++ -O2 -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI="$ABI" \
      "$CARRY/torch_raw_shim.cpp" -I"$TORCH_DIR/include" -I"$CUDA_INC" -L"$TORCH_DIR/lib" \
      -lc10_cuda -lc10 -Wl,-rpath,"$TORCH_DIR/lib" -o /tmp/libtorch_raw_shim.so 2>"$R/shim.log"; then
      SHIM="--torch-shim /tmp/libtorch_raw_shim.so"
      echo "torch raw_alloc shim built (libc10_cuda from $TORCH_DIR/lib)"
    else
      echo "torch raw_alloc shim NOT built (see shim.log); the C++ column will be empty"
      tail -5 "$R/shim.log" 2>/dev/null
    fi
    # shellcheck disable=SC2086
    "$CARRY/cuda_bench" $SHIM --json "$R/bench.json" 2>&1 | tee "$R/bench.txt"
    echo "   ($((SECONDS - T0)) s)"
  fi

  if want models; then
    echo "== ResNet-50 and GPT-2: PyTorch eager, then Vramroom (vramroom bench models) =="
    local ITERS=20
    [ -n "$QUICK" ] && ITERS=10
    python3 scripts/torch_models_bench.py "$R/torch_models.jsonl" $QUICK --iters $ITERS --warmup 3 2>&1 |
      grep -vE '^\{' || true
    # shellcheck disable=SC2086
    "$CARRY/vramroom" bench models $QUICK --iters $ITERS --warmup 3 \
      --reference "$R/torch_models.jsonl" --json "$R/models.jsonl" 2>&1 | tee "$R/models.txt"
    echo "   ($((SECONDS - T0)) s)"
  fi

  if want workloads; then
    echo "== PyTorch workloads: native allocator vs vramroom_torch =="
    : >"$R/workloads.jsonl"
    export VRAMROOM_TORCH_LIB=$CARRY/libvramroom_torch.so
    export VRAMROOM_RECORD_DIR=/tmp/vramroom-traces
    mkdir -p "$VRAMROOM_RECORD_DIR"
    for m in native native-record native-expandable vramroom vramroom-expandable; do
      echo "-- $m"
      python3 scripts/torch_workloads.py "$m" "$R/workloads.jsonl" $QUICK 2>&1 | tee -a "$R/workloads.log" |
        grep -vE '^\{' || true
    done
    echo "-- Vramroom's recommendation from the native trace of the serving loop"
    "$CARRY/vramroom" replay "$VRAMROOM_RECORD_DIR/gpt2_varlen_serve.pickle" --recommend 2>&1 |
      tee "$R/recommend.txt"
    VRAMROOM_ALLOC_CONF=$("$CARRY/vramroom" replay "$VRAMROOM_RECORD_DIR/gpt2_varlen_serve.pickle" \
      --recommend --json 2>/dev/null | python3 -c '
import json, sys
rows = json.load(sys.stdin)
print(next((r["alloc_conf"] for r in rows if r.get("recommended")), "default").replace("default", ""))')
    export VRAMROOM_ALLOC_CONF
    echo "-- vramroom-recommended (PYTORCH_CUDA_ALLOC_CONF=$VRAMROOM_ALLOC_CONF)"
    python3 scripts/torch_workloads.py vramroom-recommended "$R/workloads.jsonl" $QUICK 2>&1 |
      tee -a "$R/workloads.log" | grep -vE '^\{' || true
    # Step times move by 5-25% between processes (host launch overhead, clocks, the cloud
    # host's neighbours), more than the 5% being judged: two more rounds, the second in
    # reverse order and the third forward again, and the report takes each mode's best.
    # (With two rounds, one slow phase of the host could still land on both of a mode's
    # runs: it did on 2026-12-03, run e.)
    if [ -z "$QUICK" ]; then
      for round in 2 3; do
        export VRAMROOM_ROUND=$round
        local order="native native-expandable vramroom vramroom-expandable vramroom-recommended"
        [ "$round" = 2 ] && order="vramroom-recommended vramroom-expandable vramroom native-expandable native"
        for m in $order; do
          echo "-- $m (round $round)"
          python3 scripts/torch_workloads.py "$m" "$R/workloads.jsonl" 2>&1 |
            tee -a "$R/workloads.log" | grep -vE '^\{' || true
        done
      done
      unset VRAMROOM_ROUND
    fi
    echo "   ($((SECONDS - T0)) s)"
  fi

  if want loadtest; then
    echo "== vramroom loadtest --device cuda (NVML beside the allocator) =="
    "$CARRY/vramroom" loadtest --device cuda --model resnet18 --batch 8 --stages 1:3s,4:3s --no-search \
      --out "$R/loadtest" --json --quiet >"$R/loadtest.json" 2>"$R/loadtest.err"
    echo "exit $?"; tail -3 "$R/loadtest.err"
    python3 - "$R/loadtest.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("no results:", e); sys.exit()
tl = r.get("timeline", [])
mib = 1 << 20
pts = [s for s in tl if s.get("process_used_bytes")]
print("device %s, %d requests ok, %d timeline samples, %d with NVML process bytes" % (
    r.get("device"), (r.get("requests") or {}).get("ok", 0),
    len(tl), len(pts)))
for s in r.get("memory_sources", []):
    print("  source %-12s %-6s %4d samples  series %s" % (s["name"], s["status"], s["samples"], ",".join(s["series"])))
if pts:
    last = pts[-1]
    print("  last sample: allocated %.1f MiB, reserved %.1f MiB, NVML process %.1f MiB, overhead %.1f MiB" % (
        last.get("allocated_bytes", 0) / mib, last.get("reserved_bytes", 0) / mib,
        last["process_used_bytes"] / mib, (last.get("overhead_bytes") or 0) / mib))
PY
  fi

  if want hf; then
    echo "== Hugging Face configs: transformers (SDPA) vs vramroom --model PATH on cuda =="
    if python3 -c 'import transformers' 2>/dev/null; then
      python3 scripts/hf_speed.py "$CARRY/vramroom" "$R/hf_speed.jsonl" 2>&1 | grep -v '^{' | tee "$R/hf_speed.txt"
    else
      echo "(transformers is not installed here: skipped)"
    fi
    echo "   ($((SECONDS - T0)) s)"
  fi

  if want attn; then
    echo "== attention forward alone: naive vs fast kernel (flash.cu) vs PyTorch SDPA =="
    local TORCH_ATTN=""
    if python3 scripts/torch_sdpa_bench.py "$R/torch_sdpa.jsonl" 2>&1 | tee "$R/torch_sdpa.txt"; then
      TORCH_ATTN="--torch $R/torch_sdpa.jsonl"
    fi
    # shellcheck disable=SC2086
    "$CARRY/attention_bench" $TORCH_ATTN --json "$R/attention.jsonl" 2>&1 | tee "$R/attention.txt"
    echo "   ($((SECONDS - T0)) s)"
  fi

  if want probe && [ -f python/vramroom/probe.py ]; then
    echo "== vramroom.probe against a real PyTorch service =="
    if [ -f scripts/probe_check.py ]; then
      python3 scripts/probe_check.py "$CARRY/vramroom" "$R" 2>&1 | tee "$R/probe.txt"
    else
      echo "(no scripts/probe_check.py)"
    fi
  fi

  if want http; then
    echo "== vramroom bench http: Vramroom's client against wrk and oha, loopback, half the cores each =="
    local peers=0
    for peer in wrk oha; do
      # wrk --version exits 1; what matters is that it runs (its libraries resolve).
      local v
      v=$(PATH=$CARRY/bin:$PATH LD_LIBRARY_PATH=$CARRY/bin/lib $peer --version 2>&1)
      if [[ "$v" == *"$peer"* ]]; then
        peers=$((peers + 1))
        PATH=$CARRY/bin:$PATH LD_LIBRARY_PATH=$CARRY/bin/lib "$CARRY/vramroom" bench http \
          --peer $peer -c 64 -z 3s --rounds 3 2>&1 | tee -a "$R/http.txt" | tail -5
      else
        echo "($peer: not here)"
      fi
    done
    echo "   ($((SECONDS - T0)) s)"
  fi

  echo "== report =="
  python3 scripts/gpu_report.py "$R" | tee "$R/report.txt"
  echo "total $((SECONDS - T0)) s"
}

case "$MODE" in
build) build ;;
gpu) gpu ;;
*) echo "usage: $0 build | gpu [--quick] [--only tests,alloc,models,workloads,probe,loadtest,http,hf,attn]" >&2; exit 2 ;;
esac
