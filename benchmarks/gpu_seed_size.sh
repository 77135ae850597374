#!/usr/bin/env bash
# Seed-size runs for a lent GPU, in one call (the machine has torch but no geo stack):
#  1. `geodbk benchmark --protocol seed-table2` at r=1024, h=256 on download and upload, one
#     process per (target, model), all at once on the one GPU, merged into one report per target;
#  2. the model part of a 16384 x 16384 map (area and tile quantities) and the step/prediction
#     timings of bench_scaling at the seed size, alone on the GPU afterwards.
# Usage: benchmarks/gpu_seed_size.sh RUN OUT   (RUN holds tiles.parquet; OUT receives the results)
# A dry run on the CPU: DEVICE=cpu RANK=8 HIDDEN=8 EPOCHS=1 MAP_SIDE=256 benchmarks/gpu_seed_size.sh RUN OUT
set -uo pipefail
run=$1
out=$2
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
uptime | tee -a "$out/gpu.txt"
pids=()
for target in download upload; do
  for model in sv-rbf sv-dkl dbk-rbf; do
    timeout "${TRAIN_CAP_S:-420}" python3 benchmarks/stage_only.py benchmark --run "$run" \
      --target "$target" --protocol seed-table2 --models "$model" --merge \
      --rank "${RANK:-1024}" --hidden "${HIDDEN:-256}" --batch-size 1024 --threads 1 \
      --device "${DEVICE:-cuda}" ${EPOCHS:+--epochs $EPOCHS} \
      >"$out/${target}_${model}.log" 2>&1 &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
cp "$run"/benchmark/*_seed-table2.* "$out"/ 2>/dev/null
uptime | tee -a "$out/gpu.txt"
timeout "${MAP_CAP_S:-200}" python3 benchmarks/bench_scaling.py model --device "${DEVICE:-cuda}" \
  --configs "${RANK:-1024}:${HIDDEN:-256}:1024" --map-side "${MAP_SIDE:-16384}" --map-cap-s 80 \
  --out "$out/scaling.json" \
  2>&1 | tee "$out/scaling.log"
