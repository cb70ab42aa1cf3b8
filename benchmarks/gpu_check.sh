#!/usr/bin/env bash
# The executor's GPU check, prepared for a lent CUDA machine (one short run, all checks at once).
#
#   bash benchmarks/gpu_check.sh OUTDIR
#   DEVICE=cpu RANKS=2 bash benchmarks/gpu_check.sh OUTDIR    # the same steps on CPU (a dry run)
#   CALIBRATE=1 bash benchmarks/gpu_check.sh OUTDIR           # also the cost model's measurements
#
# Assumes python3 with torch (CUDA) is installed there; pydantic may have to be carried as
# wheels in .whl/ (the machine has no package index): they are installed first when present.
# Per model: profile on the GPU, plan for the GPUs there are, run the plan with NCCL (one rank
# per GPU), and run the same plan on gloo/CPU to compare losses; then the second pass: calibrate
# the profile to the NCCL run's trace, plan again with the fitted per-action overhead, run that.
# With one GPU the plan has one device (NCCL refuses two ranks on one GPU). Writes
# OUTDIR/gpu_check.md and the JSON it read. With CALIBRATE=1, first measures the kernels and
# layers the cost model prices (benchmarks/calibrate_gpu.py, torch only; --small on CPU) into
# OUTDIR/measured.json, for benchmarks/calibration_report.py (docs/COSTMODEL.md).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
device=${DEVICE:-cuda}
if [ "$device" = cuda ]; then
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    backend=nccl
else
    gpus=${RANKS:-2}
    backend=gloo
fi
if [ "${CALIBRATE:-0}" = 1 ]; then
    small=()
    [ "$device" = cuda ] || small=(--small)
    python3 benchmarks/calibrate_gpu.py --device "$device" "${small[@]}" -o "$out/measured.json" \
        > "$out/calibrate_gpu.log" || echo "calibrate_gpu.py failed: see $out/calibrate_gpu.log"
fi
report="$out/gpu_check.md"
{
    python3 -c "import torch, sys; gpu = sys.argv[1] == 'cuda'
print('# Executor check:', torch.cuda.get_device_name(0) if gpu else 'CPU', torch.__version__, end='')" "$device"
    echo ", $gpus rank(s), backend $backend"
    echo
    echo "| model | ranks | measured iteration ms | predicted ms | error | second pass: measured ms | predicted ms | error | losses vs gloo/CPU (max rel diff) |"
    echo "|---|---|---|---|---|---|---|---|---|"
} > "$report"
for model in tiny-hybrid tiny-moe tiny-vlm; do
    # The same sizes in the profile and the run, so the prediction applies.
    sizes=(--seq-len "${SEQ_LEN:-256}" --micro-batch-size "${MICRO_BATCH_SIZE:-2}")
    python3 -m octopipe profile --model "$model" --device "$device" --repeats 10 "${sizes[@]}" \
        --nproc "$gpus" -o "$out/$model.profile.json" || continue
    python3 -m octopipe plan --profile "$out/$model.profile.json" --devices "$gpus" \
        --microbatches $((4 * gpus)) --quiet --time-budget 20 -o "$out/$model" > /dev/null || continue
    python3 -m octopipe run --plan "$out/$model/plan.json" --model "$model" --backend "$backend" \
        "${sizes[@]}" --steps 6 --json --trace "$out/$model.trace.json" > "$out/$model.run.json" \
        || continue
    python3 -m octopipe run --plan "$out/$model/plan.json" --model "$model" --backend gloo \
        "${sizes[@]}" --nproc "$gpus" --steps 6 --json > "$out/$model.cpu.json" || continue
    overhead=$(python3 -m octopipe calibrate --profile "$out/$model.profile.json" \
        --plan "$out/$model/plan.json" --trace "$out/$model.trace.json" -o "$out/$model.cal.json" \
        | sed -n 's/.*--action-overhead \([0-9.e-]*\).*/\1/p') || continue
    python3 -m octopipe plan --profile "$out/$model.cal.json" --devices "$gpus" \
        --microbatches $((4 * gpus)) --quiet --time-budget 10 --action-overhead "${overhead:-0}" \
        -o "$out/$model-2" > /dev/null || continue
    python3 -m octopipe run --plan "$out/$model-2/plan.json" --model "$model" --backend "$backend" \
        "${sizes[@]}" --steps 6 --json > "$out/$model.run2.json" || continue
    python3 - "$model" "$gpus" "$out/$model.run.json" "$out/$model.cpu.json" \
        "$out/$model.run2.json" >> "$report" <<'EOF'
import json
import sys

model, ranks, gpu_path, cpu_path, second_path = sys.argv[1:]
gpu, cpu, second = (  # `run --json`: a line per step, the summary last
    json.loads(open(p).read().splitlines()[-1]) for p in (gpu_path, cpu_path, second_path)
)
diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(gpu["losses"], cpu["losses"]))
cells = []
for run in (gpu, second):
    measured, predicted = run["iteration_time"], run["predicted_iteration_time"]
    cells.append(f"{measured * 1e3:.2f} | {predicted * 1e3:.2f} | {measured / predicted - 1:+.1%}")
print(f"| {model} | {ranks} | {' | '.join(cells)} | {diff:.1e} |")
EOF
done
cat "$report"
