#!/usr/bin/env bash
# The held RBF kernel (`kernel_update_every`) and `torch.compile` on a lent GPU, in one call:
#  1. at once on the one GPU, nothing timed: the GPU-marked tests (`pytest -m gpu`: CUDA against
#     the CPU, kernel_update_every 2 among them) and `geodbk train` at the seed's size (r=1024,
#     h=256, batch 1024; GP only: no tile effect, no local layer) on SPLIT's download with
#     kernel_update_every 1, 4 and 8 and seeds 0 and 1, up to EPOCHS epochs; then each run's
#     test NLL (benchmarks/bench_training_blocks.py --test-nll);
#  2. alone afterwards, timed: benchmarks/bench_core.py on CUDA with --kernel-every 4 and 8
#     (paired rounds against GPyTorch SV-DKL), one epoch of DBKRegressor.fit on 10^6 rows at
#     the seed's size with kernel_update_every 1, 4 and 8 (benchmarks/bench_scaling.py model),
#     and benchmarks/bench_compile.py eager and compiled for DBK-RBF and DBK-SiLU at the seed's
#     size; each capped so that the call ends by DEADLINE_S.
# Everything lands in OUT/results.tgz (and OUT/machine.txt).
# Usage: benchmarks/gpu_kernel_every.sh SPLIT OUT   (SPLIT: one `geodbk ingest --split random`).
# The GPU machine lacks the geo stack: carry it as in benchmarks/gpu_session.sh.
# A dry run on the CPU:
#   PYTHON=.venv/bin/python DEVICE=cpu RANK=8 HIDDEN=8 EPOCHS=1 ROWS=2e4 \
#     benchmarks/gpu_kernel_every.sh SPLIT OUT
set -uo pipefail
split=$1
out=$2
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
rank=${RANK:-1024}
hidden=${HIDDEN:-256}
deadline=${DEADLINE_S:-480}
t0=$(date +%s)
work=${WORK:-/tmp/gpu_kernel_every}
res=$work/results
mkdir -p "$out" "$res"
export PYTHONPATH=".:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${THREADS:-1}
left() { local s=$((deadline - ($(date +%s) - t0))); echo $((s > 1 ? s : 1)); }
mark() { echo "$1: rc=$2 at $(($(date +%s) - t0)) s, $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1; uptime
  getconf _NPROCESSORS_ONLN; $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"
} >"$out/machine.txt"
cat "$out/machine.txt"
runs=()
pids=()
for every in 1 4 8; do
  for seed in 0 1; do
    run=$work/k${every}s${seed}
    mkdir -p "$run"
    cp "$split"/{tiles.parquet,region.geojson,urban_areas.geojson,ingest_report.json} "$run/"
    printf 'rank: %s\nhidden: %s\nbatch_size: 1024\nepochs: %s\npatience: 20\ndevice: %s\nseed: %s\nkernel_update_every: %s\n' \
      "$rank" "$hidden" "${EPOCHS:-100}" "$device" "$seed" "$every" >"$run/cfg.yaml"
    timeout "${TRAIN_CAP_S:-170}" "$py" -m pipelines.cli train --run "$run" --target download \
      --config "$run/cfg.yaml" --no-tile-effect --no-local-layer --no-progress \
      >"$res/train_k${every}s${seed}.log" 2>&1 &
    pids+=($!)
    runs+=("$run")
  done
done
timeout 200 "$py" -m pytest -q -m gpu -p no:cacheprovider tests >"$res/pytest_gpu.log" 2>&1
mark "pytest -m gpu" $?
for pid in "${pids[@]}"; do wait "$pid"; done
mark trainings 0
timeout "$(left)" "$py" benchmarks/bench_training_blocks.py --test-nll "${runs[@]}" >"$res/test_nll.txt" 2>&1
mark "test NLL" $?
# the other jobs have ended: the 1-minute load is only their decaying average
for every in 4 8; do
  timeout "$(left)" "$py" benchmarks/bench_core.py --device "$device" --threads 1 --rounds 3 \
    --steps 20 --kernel-every "$every" --out "$res/core_k$every.json" >"$res/core_k$every.log" 2>&1
  mark "bench_core K=$every" $?
done
timeout "$(left)" "$py" benchmarks/bench_scaling.py model --device "$device" \
  --configs "$rank:$hidden:1024" --epoch-rows "${ROWS:-1e6}" --kernel-every 1 4 8 \
  --out "$res/epoch.json" >"$res/epoch.log" 2>&1
mark "epochs" $?
for expansion in silu rbf; do
  for mode in eager compile; do
    timeout "$(left)" "$py" benchmarks/bench_compile.py --device "$device" --expansion "$expansion" \
      --rank "$rank" --hidden "$hidden" --batch 1024 --steps 30 --mode "$mode" \
      >>"$res/compile.jsonl" 2>"$res/compile_${expansion}_$mode.err"
    mark "compile $expansion $mode" $?
  done
done
uptime >>"$out/machine.txt"
tar czf "$out/results.tgz" -C "$work" results
