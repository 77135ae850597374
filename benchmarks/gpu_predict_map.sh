#!/usr/bin/env bash
# `geodbk predict` end to end at the seed's size on a lent GPU, in one call:
#  1. `geodbk train` at r=1024, h=256, batch 1024 (tile effect and local layer as by default),
#     up to EPOCHS epochs; the trained model is packed into OUT/model.tgz for CPU timings;
#  2. the phases of a ~268 M-cell map (the cell count of 16384 x 16384) over the run's tiles
#     extent, area quantity (benchmarks/bench_predict_phases.py: one cold call, one warm);
#  3. the area and tile maps at ~12 M and ~268 M cells, each in its own process, first and warm
#     calls with peak RSS (benchmarks/bench_tile_maps.py);
#  4. one epoch of DBKRegressor.fit on 10^6 rows at the seed's size (benchmarks/bench_scaling.py).
# Usage: benchmarks/gpu_predict_map.sh RUN OUT   (RUN holds an ingest: tiles.parquet,
# region.geojson, urban_areas.geojson, ingest_report.json). The GPU machine has no geopandas,
# shapely, pyproj, rasterio, rioxarray, h5netcdf or isal: carry their wheels and put them on
# PYTHONPATH first (/work/.library/device/README.md).
# A dry run on the CPU:
#   DEVICE=cpu RANK=8 HIDDEN=8 EPOCHS=1 CELLS="100000" BIG=1000000 benchmarks/gpu_predict_map.sh RUN OUT
set -uo pipefail
run=$1
out=$2
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH=".:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${THREADS:-1}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1; uptime; getconf _NPROCESSORS_ONLN;
  $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"; } >"$out/machine.txt"
cat "$out/machine.txt"
cat >"$run/cfg.yaml" <<CFG
rank: ${RANK:-1024}
hidden: ${HIDDEN:-256}
batch_size: 1024
epochs: ${EPOCHS:-150}
patience: ${PATIENCE:-20}
device: ${DEVICE:-cuda}
CFG
start=$(date +%s)
timeout "${TRAIN_CAP_S:-200}" $py -m pipelines.cli train --run "$run" --target download \
  --config "$run/cfg.yaml" >"$out/train.log" 2>&1
echo "train rc=$? $(( $(date +%s) - start )) s" | tee -a "$out/machine.txt"
tar -czf "$out/model.tgz" -C "$run" models
timeout "${PHASES_CAP_S:-120}" $py benchmarks/bench_predict_phases.py --run "$run" \
  --target download --cells "${BIG:-268435456}" --calls 1 >"$out/phases.jsonl" 2>"$out/phases.err"
echo "phases rc=$?" | tee -a "$out/machine.txt"
timeout "${MAPS_CAP_S:-220}" $py benchmarks/bench_tile_maps.py --run "$run" --target download \
  --cells ${CELLS:-12000000} "${BIG:-268435456}" --max-load "${MAX_LOAD:-4}" \
  --out "$out/tile_maps.json" >"$out/tile_maps.log" 2>&1
echo "maps rc=$?" | tee -a "$out/machine.txt"
timeout "${EPOCH_CAP_S:-50}" $py benchmarks/bench_scaling.py model --device "${DEVICE:-cuda}" \
  --configs "${RANK:-1024}:${HIDDEN:-256}:1024" --epoch-rows 1e6 --out "$out/scaling.json" \
  >"$out/scaling.log" 2>&1
echo "epoch rc=$?" | tee -a "$out/machine.txt"
uptime >>"$out/machine.txt"
