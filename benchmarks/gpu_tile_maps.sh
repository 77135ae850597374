#!/usr/bin/env bash
# The local-layer comparison of docs/decisions/local_layer.md at the seed's size, for a lent GPU, in one call:
#  1. `geodbk train --no-tile-effect` at r=1024, h=256, batch 1024, up to 400 epochs (patience 25),
#     one process per (split, target, pooled|time), all at once on the one GPU;
#  2. benchmarks/bench_local_layer.py on each trained run (the tile effect, the local layer and
#     the kriging anchor fitted on the CPU, one thread each, all at once), with the tile effect's
#     tests shift (NAME.json) and, on the same GP, without it (NAME.no_shift.json);
#  3. the result JSONs, training histories and logs packed into OUT/tile_maps.tgz (the device
#     tool returns at most 8 files).
# Usage: benchmarks/gpu_tile_maps.sh SPLITS OUT   (SPLITS/random, SPLITS/tile, SPLITS/block: one
# `geodbk ingest --split ...` each). The GPU machine has no geopandas, shapely, pyproj, isal or pykrige:
# carry their wheels and put them on PYTHONPATH first (/work/.library/device/README.md).
# BATCH and EXTRA_CFG (YAML lines, e.g. 'kernel_update_every: 1') change the GPs' config. The
# r = 256 table of docs/decisions/local_layer.md on the CPU (its GPs trained under kernel_update_every 1):
#   PYTHON=.venv/bin/python DEVICE=cpu RANK=256 HIDDEN=64 BATCH=512 EPOCHS=150 PATIENCE=20 \
#     EXTRA_CFG='kernel_update_every: 1' TRAIN_CAP_S=7200 BENCH_CAP_S=1800 \
#     benchmarks/gpu_tile_maps.sh SPLITS OUT
# A dry run on the CPU:
#   PYTHON=.venv/bin/python DEVICE=cpu RANK=8 HIDDEN=8 EPOCHS=1 SPLITS_LIST=tile MODES=pooled benchmarks/gpu_tile_maps.sh SPLITS OUT
set -uo pipefail
splits=$1
out=$2
work=${WORK:-/tmp/gpu_tile_maps}
mkdir -p "$out" "$work"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1; uptime
  "${PYTHON:-python3}" -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
} >"$work/machine.txt"
cat >"$work/cfg.yaml" <<CFG
rank: ${RANK:-1024}
hidden: ${HIDDEN:-256}
batch_size: ${BATCH:-1024}
epochs: ${EPOCHS:-400}
patience: ${PATIENCE:-25}
device: ${DEVICE:-cuda}
${EXTRA_CFG:-}
CFG
runs=()
for split in ${SPLITS_LIST:-random tile block}; do
  for target in ${TARGETS:-download upload}; do
    for mode in ${MODES:-pooled time}; do
      name=$split-$target-$mode
      mkdir -p "$work/$name"
      cp "$splits/$split"/{tiles.parquet,region.geojson,urban_areas.geojson,ingest_report.json} \
        "$work/$name/"
      runs+=("$name")
    done
  done
done
start=$(date +%s)
pids=()
for name in "${runs[@]}"; do
  IFS=- read -r split target mode <<<"$name"
  timeout "${TRAIN_CAP_S:-330}" "${PYTHON:-python3}" benchmarks/stage_only.py train --run "$work/$name" \
    --target "$target" --config "$work/cfg.yaml" --no-tile-effect --no-progress \
    $([ "$mode" = time ] && echo --time) >"$work/train_$name.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "training: $(($(date +%s) - start)) s" | tee -a "$work/machine.txt"
start=$(date +%s)
pids=()
for name in "${runs[@]}"; do
  IFS=- read -r split target mode <<<"$name"
  [ -f "$work/$name/models/$target/model.json" ] || continue
  cp "$work/$name/models/$target/history.csv" "$work/history_$name.csv"
  timeout "${BENCH_CAP_S:-150}" "${PYTHON:-python3}" benchmarks/bench_local_layer.py --run "$work/$name" \
    --target "$target" --out "$work/$name.json" >"$work/bench_$name.log" 2>&1 &
  pids+=($!)
  timeout "${BENCH_CAP_S:-150}" "${PYTHON:-python3}" benchmarks/bench_local_layer.py --run "$work/$name" \
    --target "$target" --no-tests-mean --out "$work/$name.no_shift.json" \
    >"$work/bench_$name.no_shift.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "local layers: $(($(date +%s) - start)) s" | tee -a "$work/machine.txt"
uptime >>"$work/machine.txt"
(cd "$work" && tar czf "$out/tile_maps.tgz" machine.txt cfg.yaml ./*.json ./*.log ./*.csv 2>/dev/null)
ls -la "$out"
