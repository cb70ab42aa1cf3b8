#!/usr/bin/env bash
# The executor's GPU check, prepared for a lent CUDA machine (one short run, all checks at once).
#
#   bash benchmarks/gpu_check.sh OUTDIR
#   DEVICE=cpu RANKS=2 bash benchmarks/gpu_check.sh OUTDIR    # the same steps on CPU (a dry run)
#
# Assumes python3 with torch (CUDA) is installed there; pydantic may have to be carried as
# wheels in .whl/ (see the device tool's notes): they are installed first when present.
# Per model: profile on the GPU, plan for the GPUs there are, run the plan with NCCL (one rank
# per GPU), and run the same plan on gloo/CPU to compare losses. With one GPU the plan has one
# device (NCCL refuses two ranks on one GPU). Writes OUTDIR/gpu_check.md and the JSON it read.
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
report="$out/gpu_check.md"
{
    python3 -c "import torch, sys; gpu = sys.argv[1] == 'cuda'
print('# Executor check:', torch.cuda.get_device_name(0) if gpu else 'CPU', torch.__version__, end='')" "$device"
    echo ", $gpus rank(s), backend $backend"
    echo
    echo "| model | ranks | measured iteration ms | predicted ms | error | losses vs gloo/CPU (max rel diff) |"
    echo "|---|---|---|---|---|---|"
} > "$report"
for model in tiny-hybrid tiny-moe tiny-vlm; do
    # The same sizes in the profile and the run, so the prediction applies.
    sizes=(--seq-len "${SEQ_LEN:-256}" --micro-batch-size "${MICRO_BATCH_SIZE:-2}")
    python3 -m octopipe profile --model "$model" --device "$device" --repeats 10 "${sizes[@]}" \
        -o "$out/$model.profile.json" || continue
    python3 -m octopipe plan --profile "$out/$model.profile.json" --devices "$gpus" \
        --microbatches $((4 * gpus)) --quiet --time-budget 20 -o "$out/$model" > /dev/null || continue
    python3 -m octopipe run --plan "$out/$model/plan.json" --model "$model" --backend "$backend" \
        "${sizes[@]}" --steps 6 --json > "$out/$model.run.json" || continue
    python3 -m octopipe run --plan "$out/$model/plan.json" --model "$model" --backend gloo \
        "${sizes[@]}" --nproc "$gpus" --steps 6 --json > "$out/$model.cpu.json" || continue
    python3 - "$model" "$gpus" "$out/$model.run.json" "$out/$model.cpu.json" >> "$report" <<'EOF'
import json
import sys

model, ranks, gpu_path, cpu_path = sys.argv[1:]
gpu, cpu = json.load(open(gpu_path)), json.load(open(cpu_path))
err = gpu["iteration_time"] / gpu["predicted_iteration_time"] - 1
diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(gpu["losses"], cpu["losses"]))
print(
    f"| {model} | {ranks} | {gpu['iteration_time'] * 1e3:.2f} "
    f"| {gpu['predicted_iteration_time'] * 1e3:.2f} | {err:+.1%} | {diff:.1e} |"
)
EOF
done
cat "$report"
