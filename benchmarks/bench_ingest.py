"""Benchmark: ingest ~1 million synthetic Ookla tiles with urban labelling.

Builds (once, untimed) four quarters of official-schema parquet tiles (``quadkey``, ``tile`` WKT,
measures) drawn from ``--unique`` distinct zoom-16 tiles over a 6° x 4° region, a region polygon
with 720 vertices and ``--urban-polygons`` urban-area polygons in the UAC20 schema; then runs
``pipelines.ingest.run_ingest`` in a fresh subprocess and reports its wall time and peak RSS.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ingest.py --n 1000000 --workdir /tmp/bench_ingest
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import geopandas as gpd
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from geodbk.geo import quadkey as qk  # noqa: E402
from geodbk.geo.frame import tile_polygons  # noqa: E402

LON0, LAT0, HALF_W, HALF_H = -96.0, 38.0, 3.0, 2.0


def build(workdir: Path, *, n: int, unique: int, urban_polygons: int, seed: int = 0) -> None:
    """Write the benchmark inputs under ``workdir`` (skipped when present)."""
    marker = workdir / f"inputs_{n}_{unique}_{urban_polygons}.json"
    if marker.is_file():
        return
    rng = np.random.default_rng(seed)
    x0, y0 = qk.lonlat_to_tile([LON0 - HALF_W], [LAT0 + HALF_H], 16)
    x1, y1 = qk.lonlat_to_tile([LON0 + HALF_W], [LAT0 - HALF_H], 16)
    nx, ny = int(x1[0] - x0[0]), int(y1[0] - y0[0])
    cells = rng.choice(nx * ny, size=unique, replace=False)
    ux, uy = x0[0] + cells % nx, y0[0] + cells // nx
    per_q = n // 4
    for q in range(4):
        pick = np.sort(rng.choice(unique, size=per_q, replace=False))
        x, y = ux[pick], uy[pick]
        keys = qk.tile_to_quadkey(x, y, np.full(per_q, 16))
        wkt = shapely.to_wkt(tile_polygons(*qk.tile_bounds(x, y, 16)), rounding_precision=-1)
        table = pa.table(
            {
                "quadkey": pa.array(keys.astype(str)),
                "tile": pa.array(wkt.astype(str)),
                "avg_d_kbps": rng.integers(1, 300_000, per_q),
                "avg_u_kbps": rng.integers(1, 50_000, per_q),
                "avg_lat_ms": rng.integers(1, 300, per_q),
                "tests": rng.integers(1, 100, per_q),
                "devices": rng.integers(1, 10, per_q),
            }
        )
        path = (
            workdir
            / f"tiles/type=mobile/year=2023/quarter={q + 1}"
            / f"2023-{3 * q + 1:02d}-01_performance_mobile_tiles.parquet"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    theta = np.linspace(0, 2 * np.pi, 721)[:-1]
    r = 1 + 0.05 * np.sin(7 * theta)
    region = shapely.Polygon(
        np.column_stack(
            [LON0 + HALF_W * 0.98 * r * np.cos(theta), LAT0 + HALF_H * 0.98 * r * np.sin(theta)]
        )
    )
    gpd.GeoDataFrame({"NAME": ["Benchland"]}, geometry=[region], crs="EPSG:4326").to_file(
        workdir / "region.geojson"
    )
    cx = rng.uniform(LON0 - HALF_W, LON0 + HALF_W, urban_polygons)
    cy = rng.uniform(LAT0 - HALF_H, LAT0 + HALF_H, urban_polygons)
    rad = rng.uniform(0.005, 0.05, urban_polygons)
    t = np.linspace(0, 2 * np.pi, 41)[:-1]
    polys = [
        shapely.Polygon(
            np.column_stack([a + b * np.cos(t) * (1 + 0.2 * np.sin(3 * t)), c + b * np.sin(t)])
        )
        for a, c, b in zip(cx, cy, rad, strict=True)
    ]
    gpd.GeoDataFrame(
        {
            "UACE20": [f"{i:05d}" for i in range(urban_polygons)],
            "NAME20": [f"Town {i}" for i in range(urban_polygons)],
        },
        geometry=polys,
        crs="EPSG:4326",
    ).to_crs("EPSG:4269").to_file(workdir / "uac20.gpkg")
    marker.write_text(json.dumps({"n": n, "unique": unique, "urban_polygons": urban_polygons}))


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
t0 = time.perf_counter()
from pipelines.ingest import run_ingest
t1 = time.perf_counter()
report = run_ingest(tiles=[{tiles!r}], run={run!r}, type="mobile", region={region!r},
                    urban_areas={uac!r}, split="random", seed=0)
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "ingest_s": t2 - t1, "report_s": report["seconds"],
                  "counts": report["counts"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1_000_000, help="tile-quarters (4 quarters)")
    parser.add_argument("--unique", type=int, default=400_000, help="distinct tiles")
    parser.add_argument("--urban-polygons", type=int, default=2_600, help="urban-area polygons")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_ingest"))
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    build(args.workdir, n=args.n, unique=args.unique, urban_polygons=args.urban_polygons)
    print(f"inputs ready in {time.perf_counter() - t:.1f} s under {args.workdir}")
    code = _CHILD.format(
        repo=str(REPO),
        tiles=str(args.workdir / "tiles"),
        run=str(args.workdir / "run"),
        region=str(args.workdir / "region.geojson"),
        uac=str(args.workdir / "uac20.gpkg"),
    )
    results = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["process_wall_s"] = wall
        results.append(res)
        print(json.dumps(res))
    best = min(results, key=lambda r: r["ingest_s"])
    size = sum(p.stat().st_size for p in (args.workdir / "tiles").rglob("*.parquet"))
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}, "
        f"input parquet {size / 1e6:.0f} MB, peak RSS {best['peak_rss_mb']:.0f} MB, "
        f"ingest {best['ingest_s']:.1f} s (process {best['process_wall_s']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
