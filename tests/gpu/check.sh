#!/usr/bin/env bash
# The prepared check on a real GPU (issue 38): runs a prebuilt gpustall on two real CUDA
# training loops of about a minute each, on a machine with an NVIDIA GPU, PyTorch with CUDA and
# no network, and says what it saw. Nothing here is built; nothing is downloaded.
#
#   tests/gpu/check.sh GPUSTALL_BINARY OUTDIR [PYTHON] [SECONDS]
#
# It runs, as root (eBPF):
#   1. a loop starved by a slow DataLoader (workers sleep 100 ms a sample: the GPU idles about
#      1.6 s between batches, a stall with the 1 s window used here);
#   2. a GPU-bound loop (large matmuls, a fast loader).
# and checks, in OUTDIR/checks.txt (each line PASS, FAIL or INFO):
#   - NVML samples with utilisation, and the trainer's own GPU memory (per-process samples);
#   - GPU stall episodes in the starved run, none in the GPU-bound one;
#   - the trainer's GPU wait against its data wait, each the larger in its own run;
#   - the libcuda symbols the uprobes found;
#   - whether NVML's Xid event set could be registered.
# The summaries, reports and recordings are in OUTDIR. Under 5 minutes with SECONDS=60.
set -u
BIN=${1:?usage: check.sh GPUSTALL_BINARY OUTDIR [PYTHON] [SECONDS]}
OUT=${2:?usage: check.sh GPUSTALL_BINARY OUTDIR [PYTHON] [SECONDS]}
PY=${3:-python3}
SECS=${4:-60}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"
  echo "gpustall: $("$BIN" --version 2>&1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -8
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

for shape in starved gpu; do
  echo "== $shape: $SECS s"
  RUST_LOG=gpustall=info timeout $((SECS + 120)) "$BIN" trace --gpu-interval 200ms --stall-window 1s \
    --record "$OUT/$shape.jsonl" --summary-json "$OUT/$shape-summary.json" \
    -- "$PY" -u "$HERE/train.py" "$shape" "$SECS" \
    > "$OUT/$shape-stdout.txt" 2> "$OUT/$shape-stderr.txt"
  echo "   exit $? ($(tail -c 300 "$OUT/$shape-stdout.txt" | grep -o '"steps": [0-9]*' || echo no steps))"
done

"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/checks.txt"
import json, os, re, sys
out = sys.argv[1]

def load(shape):
    try:
        s = json.load(open(os.path.join(out, f"{shape}-summary.json")))
    except Exception as e:
        print(f"FAIL {shape}: no summary ({e})")
        return None, None
    job = None
    for line in open(os.path.join(out, f"{shape}-stdout.txt"), errors="replace"):
        if line.startswith('{"role": "trainer"'):
            job = json.loads(line)
    return s, job

def trainer(s):
    return next((p for p in (s.get("processes") or []) if p.get("role") == "trainer"), {})

def check(ok, text):
    print(("PASS " if ok else "FAIL ") + text)

for shape in ["starved", "gpu"]:
    s, job = load(shape)
    if not s:
        continue
    t = trainer(s)
    gpus = s.get("gpu") or []
    samples = sum(g.get("samples", 0) for g in gpus)
    check(samples > 0 and any(g.get("util_gpu_max_pct") is not None for g in gpus),
          f"{shape}: NVML samples with utilisation: {samples} samples, " +
          ", ".join(f"GPU {g.get('index')} {g.get('name')} util avg {g.get('util_gpu_avg_pct')} max {g.get('util_gpu_max_pct')}" for g in gpus))
    check(any(t.get("pid") in (g.get("job_pids") or []) for g in gpus),
          f"{shape}: the trainer (pid {t.get('pid')}) among the GPU's processes: {[g.get('job_pids') for g in gpus]}")
    stalls = s.get("stalls") or []
    if shape == "starved":
        check(len(stalls) > 0, f"starved: GPU stall episodes: {len(stalls)}")
    else:
        check(len(stalls) == 0, f"gpu: no GPU stall episodes: {len(stalls)}")
    g = t.get("gpu_wait") or {}
    split = t.get("time_split") or {}
    print(f"INFO {shape}: libcuda {g.get('library')} symbols probed {g.get('symbols')}; not measured: {t.get('gpu_wait_unmeasured')}")
    print(f"INFO {shape}: gpu_wait {json.dumps(g)}")
    print(f"INFO {shape}: time_split {json.dumps(split)}")
    print(f"INFO {shape}: the job's own timings {json.dumps(job)}")
    dw, gw = split.get("data_wait_ns", 0), split.get("gpu_wait_ns", 0)
    if shape == "starved":
        check(dw > gw, f"starved: data wait {dw/1e9:.2f} s > GPU wait {gw/1e9:.2f} s")
    else:
        check(gw > dw and g.get("calls", 0) > 0, f"gpu: GPU wait {gw/1e9:.2f} s > data wait {dw/1e9:.2f} s ({g.get('calls', 0)} calls)")
    if job and g:
        print(f"INFO {shape}: GPU wait {g.get('wait_ns', 0)/1e9:.2f} s against the job's loss.item() {job.get('item_s', 0):.2f} s")
    v = s.get("verdict") or {}
    print(f"INFO {shape}: verdict {v.get('cause')}: {v.get('text')}")
    err = open(os.path.join(out, f"{shape}-stderr.txt"), errors="replace").read()
    xid = [l for l in err.splitlines() if re.search(r"xid|Xid|event set", l)]
    print(f"INFO {shape}: Xid event set lines: {xid[:3] or 'none said (registered, or not logged at this level)'}")
PYEOF
echo "the check wrote $OUT/checks.txt"
