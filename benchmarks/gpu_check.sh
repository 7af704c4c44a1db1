#!/usr/bin/env bash
# The GPU check in one go: everything a GPU host should confirm, under 8 minutes on one H200.
#
#   bash benchmarks/gpu_check.sh [OUT]          # OUT: where the raw output goes (default $OUT, else ./gpu-check-<time>)
#   bash benchmarks/gpu_check.sh --cpu [OUT]    # the same steps at toy sizes on the CPU: checks the script itself
#
# Steps (each writes its own files under OUT; gpu_check.log holds everything printed):
#   0. the machine: nvidia-smi, torch and CUDA versions, the GPUs torch sees;
#   1. benchmarks/gpu_step.py: images/s per local method, the image tower's TFLOP/s and peak memory per client,
#      ViT-B/16 sizes, batch 64, in bf16 and in fp32 (IEEE, TF32 off: the app's fp32);
#   2. the default testbed federation (fedrapp-sim, 8 clients, seed 0) on CUDA in fp32 and in bf16, the 8 clients
#      sharing one GPU (--gpus-per-client 0.125), its accuracy set beside the CPU run's 54.28% micro / 55.27% macro;
#   3. a 4-client Ray simulation with client-resources-num-gpus=0.25 (four clients on one GPU), with the device each
#      client reports in rounds.jsonl.
# Needs the package installed (README: `pip install torch==2.13.0 -e .` on the GPU host). Exits non-zero when a step
# failed; the other steps still run.
set -uo pipefail

cpu=0
if [ "${1:-}" = "--cpu" ]; then cpu=1; shift; fi
out="${1:-${OUT:-gpu-check-$(date +%Y%m%d-%H%M%S)}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
exec > >(tee "$out/gpu_check.log") 2>&1
export FLWR_HOME="$out/flwr-home" RAY_TMPDIR="${RAY_TMPDIR:-/tmp/fedrapp-gpu-check-$$}" UV_CACHE_DIR="$out/uv-cache"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
failed=0
started=$SECONDS

step() {  # step NAME COMMAND...: run one step, time it, remember a failure
  local name=$1; shift
  echo; echo "=== $name ($(date +%H:%M:%S), $((SECONDS - started)) s in) ==="
  echo "+ $*"
  if "$@"; then echo "=== $name: ok"; else echo "=== $name: FAILED (exit $?)"; failed=1; fi
}

if [ "$cpu" = 1 ]; then  # toy sizes on the CPU: the same commands, seconds each
  step_args=(--tiny --device cpu --repeats 1)
  device=cpu gpus_all=0 gpus_four=0 pool="testbed-samples=512 batch-size=32 num-rounds=2"
else
  step_args=()
  device=cuda gpus_all=0.125 gpus_four=0.25 pool=""
fi

step "machine" python - <<'PY'
import platform, shutil, subprocess, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| GPUs seen by torch:", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(f"  cuda:{i}", torch.cuda.get_device_name(i))
if shutil.which("nvidia-smi"):
    print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
PY

step "gpu_step bf16" python "$root/benchmarks/gpu_step.py" "${step_args[@]}" --precision bf16 --json "$out/gpu_step_bf16.json"
step "gpu_step fp32" python "$root/benchmarks/gpu_step.py" "${step_args[@]}" --precision fp32 --json "$out/gpu_step_fp32.json"

for precision in fp32 bf16; do
  step "default federation, $precision" fedrapp-sim "$root" --gpus-per-client "$gpus_all" --flwr-home "$FLWR_HOME" \
    -c "device='$device' precision='$precision' output-dir='$out/runs' run-name='default-$precision' $pool"
done

step "4 clients on one GPU" fedrapp-sim "$root" --gpus-per-client "$gpus_four" --flwr-home "$FLWR_HOME" \
  -c "num-clients=4 device='$device' output-dir='$out/runs' run-name='four-clients' testbed-samples=1024 num-rounds=3"

step "summary" python - "$out" "$cpu" <<'PY'
import json, sys
from pathlib import Path
out, cpu = Path(sys.argv[1]), sys.argv[2] == "1"
CPU_RUN = (54.28, 55.27)  # the default run on the CPU (README)
lines = []
for precision in ("fp32", "bf16"):
    path = out / "runs" / f"default-{precision}" / "summary.json"
    if not path.is_file():
        lines.append(f"default federation {precision}: no summary (failed)")
        continue
    s = json.loads(path.read_text())
    micro, macro = 100 * s["micro_accuracy"], 100 * s["macro_accuracy"]
    ref = "" if cpu else f" (CPU run {CPU_RUN[0]:.2f} / {CPU_RUN[1]:.2f}: {micro - CPU_RUN[0]:+.2f} / {macro - CPU_RUN[1]:+.2f})"
    lines.append(f"default federation {precision}: {micro:.2f}% micro / {macro:.2f}% macro over {s['samples']} "
                 f"samples, {s['rounds']} rounds, {s['seconds']:.0f} s{ref}")
rows = out / "runs" / "four-clients" / "rounds.jsonl"
if rows.is_file():
    seen = {}
    for line in rows.read_text().splitlines():
        r = json.loads(line)
        seen.setdefault(r["client"], set()).add(r.get("device", "?"))
    lines.append("4 clients: " + "; ".join(f"client {c} on {', '.join(sorted(d))}" for c, d in sorted(seen.items())))
for name in ("gpu_step_bf16.json", "gpu_step_fp32.json"):
    if (out / name).is_file():
        lines.append(f"{name}: written")
text = "\n".join(lines)
print(text)
(out / "summary.txt").write_text(text + "\n")
PY

rm -rf "$out/flwr-home/apps" "$out/uv-cache"
echo; echo "gpu_check: $((SECONDS - started)) s; raw output in $out; $([ $failed = 0 ] && echo 'all steps ok' || echo 'SOME STEPS FAILED')"
exit $failed
