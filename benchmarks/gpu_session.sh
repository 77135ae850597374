#!/usr/bin/env bash
# The seed-size GPU benchmarks of docs/decisions/local_layer.md and docs/benchmarks/scaling.md in one call
# (a lent GPU comes with minutes, not hours, and each start costs one or two of them):
#  1. all at once on the one GPU: benchmarks/gpu_tile_maps.sh SPLITS (the twelve seed-size GPs,
#     then their tile effects, local layers and kriging anchors on the host's CPUs), and
#     `geodbk train` with its defaults (tile effect and local layer) on SPLITS/random at the
#     seed's size, up to 150 epochs, for the map timings;
#  2. then, with nothing else running: benchmarks/bench_tile_maps.py (the area and tile maps at
#     ~12 M and ~268 M cells, the cell count of 16384², each (size, quantity) in its own
#     process, first and warm calls, peak RSS) and benchmarks/bench_predict_phases.py (the area
#     map of ~268 M cells by phase), each capped so that the call ends by DEADLINE_S.
# SPLITS_LIST=none skips step 1's twelve GPs (the map timings alone, about 6 minutes).
# Usage: benchmarks/gpu_session.sh SPLITS OUT   (SPLITS/random, SPLITS/tile, SPLITS/block: one
# `geodbk ingest --split ...` each). The GPU machine lacks geopandas, shapely, pyproj, pyogrio,
# rasterio, rioxarray, h5netcdf, isal and pykrige (the versions of constraints.txt, with affine,
# click-plugins and cligj). Their cp312 wheels come to 79 MB, over the 64 MiB a call carries, so
# unpack them into one folder site/ here and carry it as an xz tarball (52 MB at xz -9e):
#   for w in WHEELS/*.whl; do unzip -q -o "$w" -d site; done; tar cf - site | xz -9e >X/site.tar.xz
# and begin the device command with: tar xJf X/site.tar.xz -C /tmp && export PYTHONPATH=/tmp/site
# A dry run on the CPU:
#   PYTHON=.venv/bin/python DEVICE=cpu RANK=8 HIDDEN=8 EPOCHS=1 SPLITS_LIST=tile MODES=pooled \
#     CELLS=100000 BIG=400000 benchmarks/gpu_session.sh SPLITS OUT
set -uo pipefail
splits=$1
out=$2
py=${PYTHON:-python3}
deadline=${DEADLINE_S:-560}
t0=$(date +%s)
work=${WORK:-/tmp/gpu_tile_maps}
maprun=$work/map-random-download
mkdir -p "$out" "$maprun"
export PYTHONPATH=".:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${THREADS:-1}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1; uptime
  getconf _NPROCESSORS_ONLN; $py -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"
} >"$out/machine.txt"
cat "$out/machine.txt"
cp "$splits/random"/{tiles.parquet,region.geojson,urban_areas.geojson,ingest_report.json} "$maprun/"
cat >"$maprun/cfg.yaml" <<CFG
rank: ${RANK:-1024}
hidden: ${HIDDEN:-256}
batch_size: 1024
epochs: ${MAP_EPOCHS:-150}
patience: 20
device: ${DEVICE:-cuda}
CFG
timeout "${TRAIN_CAP_S:-330}" "$py" -m pipelines.cli train --run "$maprun" --target download \
  --config "$maprun/cfg.yaml" --no-progress >"$out/map_train.log" 2>&1 &
map_pid=$!
[ "${SPLITS_LIST:-}" = none ] || WORK=$work PYTHON=$py bash benchmarks/gpu_tile_maps.sh "$splits" "$out"
wait "$map_pid"
echo "map model: rc=$? at $(($(date +%s) - t0)) s" | tee -a "$out/machine.txt"
uptime >>"$out/machine.txt"
left() { local s=$((deadline - ($(date +%s) - t0))); echo $((s > 1 ? s : 1)); }
# the other jobs have ended: the 1-minute load is only their decaying average, so no wait
timeout "$(left)" "$py" benchmarks/bench_tile_maps.py --run "$maprun" --target download \
  --cells ${CELLS:-12000000} "${BIG:-268435456}" --max-load 99 --out "$out/map_cost.json" \
  >"$out/map_cost.log" 2>&1
echo "maps: rc=$? at $(($(date +%s) - t0)) s" | tee -a "$out/machine.txt"
timeout "$(left)" "$py" benchmarks/bench_predict_phases.py --run "$maprun" --target download \
  --cells "${BIG:-268435456}" --calls 1 >"$out/phases.jsonl" 2>&1
echo "phases: rc=$? at $(($(date +%s) - t0)) s" | tee -a "$out/machine.txt"
uptime >>"$out/machine.txt"
