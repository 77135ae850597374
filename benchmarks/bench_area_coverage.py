"""Are ``geodbk summarize``'s area intervals honest? A simulation study on the synthetic region.

For each generator seed: generate a synthetic region (:func:`geodbk.geo.synthetic.generate`,
whose true latent field :func:`geodbk.geo.synthetic.latent_field` is known), ingest it as the
demo does (mobile, 2023Q1-2023Q4, random split), train a time-aware DBK on download with the
demo's model size (r=256, h=64), ``--epochs`` (default 400) with ``--patience`` (default 400:
best epoch by validation NLL, no early stopping) and no tile effect, cut the region into Voronoi cells of random points
("counties"), and run ``geodbk summarize --quantity area`` at the latest quarter. The truth of an
area is the cos-latitude weighted mean of the true latent field (log10 kbps, 2023Q4) over the
same grid cells the summary averages. Reported: the coverage of the 90% joint intervals and of
the intervals had the cells been independent (each with a 95% Wilson binomial interval), the
mean widths, and the spread of the standardised errors::

    OMP_NUM_THREADS=1 python benchmarks/bench_area_coverage.py --work runs/areas_bench \\
        --seeds 20240 20241 20242 --areas 80 --samples 1000 --epochs 400 --patience 400 \\
        --out docs/benchmarks/areas.md

The binomial interval treats areas as independent; they are not within one region (the
model's error is spatially smooth), which is why several generator seeds are used and the
coverage is also given per seed.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

Z90 = 1.6448536269514722


def wilson(hits: int, n: int, *, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def voronoi_areas(region: Any, n: int, *, seed: int) -> Any:
    """``n`` Voronoi cells of random points inside ``region``, clipped to it (GeoDataFrame)."""
    import geopandas as gpd
    import shapely

    rng = np.random.default_rng(seed)
    w, s, e, nn = region.bounds
    pts: list[Any] = []
    while len(pts) < n:
        x, y = rng.uniform(w, e, 4 * n), rng.uniform(s, nn, 4 * n)
        inside = shapely.intersects_xy(region, x, y)
        pts += list(shapely.points(x[inside], y[inside]))
    cells = shapely.voronoi_polygons(
        shapely.MultiPoint(pts[:n]), extend_to=shapely.box(w - 1, s - 1, e + 1, nn + 1)
    )
    polys = [shapely.intersection(c, region) for c in shapely.get_parts(cells)]
    polys = [p for p in polys if not p.is_empty]
    return gpd.GeoDataFrame(
        {"id": [f"A{k:03d}" for k in range(len(polys))]}, geometry=polys, crs="EPSG:4326"
    )


def true_area_means(
    run: Path, areas_path: Path, *, seed: int
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The weighted mean of the true field over each area's cells of the summary's grid
    (default ``geodbk predict`` grid, cells inside the region) and the cell counts; and the
    model's pointwise calibration of f: coverage of the true field by the 90% interval
    ``mean -+ 1.645 sd_f`` and the mean error (truth - mean) at those cells and at the
    latest quarter's observed tiles."""
    from geodbk.geo.areas import read_areas
    from geodbk.geo.grids import block_rows_for, region_mask
    from geodbk.geo.synthetic import SyntheticConfig, latent_field
    from geodbk.geo.table import read_table_metadata
    from geodbk.geo.timeaxis import quarter_index
    from pipelines.places import load_place_predictor
    from pipelines.predict import map_grid
    from pipelines.rundir import RunDir

    rd = RunDir(run)
    region, grid = map_grid(
        rd, resolution=None, tile_zoom=None, max_cells=1_000_000, extent="tiles"
    )
    areas = read_areas(areas_path)
    predictor = load_place_predictor(rd, "download", quantity="area")
    quarters = sorted(read_table_metadata(rd.tiles)["quarters"], key=quarter_index)
    q = quarter_index(quarters[-1]) - quarter_index(f"{SyntheticConfig.year}Q1")
    cfg = SyntheticConfig(seed=seed)

    def check(lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        truth = latent_field(lon, lat, target="download", quarter=q, config=cfg)
        f = predictor.predict(lon, lat, quantity="area")
        hit = np.abs(truth - f.mean) <= Z90 * np.sqrt(f.var)
        return truth, hit, truth - f.mean

    p = len(areas)
    wsum, tsum, count = np.zeros(p), np.zeros(p), np.zeros(p, dtype=np.int64)
    hits, errs, n = 0, 0.0, 0
    for rows in grid.row_blocks(block_rows_for(grid.shape[1])):
        (raster,) = areas.rasterise(grid, rows)
        mask = (raster >= 0) & region_mask(region, grid, rows)
        r, c = np.nonzero(mask)
        if not r.size:
            continue
        lat, lon = grid.y[rows][r], grid.x[c]
        truth, hit, err = check(lon, lat)
        hits, errs, n = hits + int(hit.sum()), errs + float(err.sum()), n + hit.size
        w = np.cos(np.radians(lat))
        ids = raster[r, c]
        wsum += np.bincount(ids, weights=w, minlength=p)
        tsum += np.bincount(ids, weights=w * truth, minlength=p)
        count += np.bincount(ids, minlength=p)
    tiles = pd.read_parquet(rd.tiles, columns=["lon", "lat", "quarter"])
    tiles = tiles[tiles["quarter"] == quarters[-1]]
    _, tile_hit, tile_err = check(tiles["lon"].to_numpy(), tiles["lat"].to_numpy())
    stats = {
        "cells": n,
        "cell_coverage90": hits / n,
        "cell_mean_error": errs / n,
        "tiles": int(tile_hit.size),
        "tile_coverage90": float(tile_hit.mean()),
        "tile_mean_error": float(tile_err.mean()),
    }
    frame = pd.DataFrame(
        {
            "id": areas.ids,
            "truth": np.where(count > 0, tsum / np.maximum(wsum, 1e-300), np.nan),
            "truth_cells": count,
        }
    )
    return frame, stats


def one_seed(
    work: Path, seed: int, *, n_areas: int, samples: int, epochs: int, patience: int
) -> dict[str, Any]:
    """Generate, ingest, train, summarise and score one synthetic region."""
    import geopandas as gpd

    from geodbk.geo.synthetic import SyntheticConfig, generate
    from pipelines.config import demo_config
    from pipelines.ingest import demo_ingest_kwargs, run_ingest
    from pipelines.summarize import run_summarize
    from pipelines.train import run_train

    base = work / f"seed{seed}"
    data, run = base / "data", base / "run"
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if not (data / "ookla").is_dir():
        generate(data, config=SyntheticConfig(seed=seed))
    seconds["generate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_ingest(run=run, **demo_ingest_kwargs(data))
    seconds["ingest"] = time.perf_counter() - t0
    config = demo_config().replace(time=True, epochs=epochs, patience=patience)
    t0 = time.perf_counter()
    run_train(run, target="download", config=config, tile_effect="off", progress=False)
    seconds["train"] = time.perf_counter() - t0
    region = gpd.read_file(run / "region.geojson").geometry.union_all()
    areas_path = base / "counties.geojson"
    voronoi_areas(region, n_areas, seed=seed).to_file(areas_path)
    t0 = time.perf_counter()
    out = run_summarize(
        run, target="download", areas=areas_path, samples=samples, quantity="area", seed=seed
    )
    seconds["summarize"] = time.perf_counter() - t0
    truth, pointwise = true_area_means(run, areas_path, seed=seed)
    got = pd.read_parquet(out).merge(truth, on="id")
    got = got[got["n_cells"] > 0].copy()
    if not (got["n_cells"] == got["truth_cells"]).all():
        raise RuntimeError("the truth was averaged over other cells than the summary's")
    got["seed"] = seed
    return {"rows": got, "seconds": seconds, "config": config.to_dict(), "pointwise": pointwise}


def score(rows: pd.DataFrame) -> dict[str, Any]:
    """Coverage (with Wilson intervals), widths and standardised errors of the area means."""
    t = rows["truth"].to_numpy()
    out: dict[str, Any] = {"areas": len(rows)}
    for name, lo, hi in (
        ("joint", "lower_log10", "upper_log10"),
        ("independent", "independent_lower_log10", "independent_upper_log10"),
    ):
        a, b = rows[lo].to_numpy(), rows[hi].to_numpy()
        hits = int(((a <= t) & (t <= b)).sum())
        sd = (b - a) / (2 * Z90)
        z = (t - rows["mean_log10"].to_numpy()) / sd
        out[name] = {
            "coverage": hits / len(rows),
            "wilson95": wilson(hits, len(rows)),
            "mean_width_log10": float(np.mean(b - a)),
            "median_width_log10": float(np.median(b - a)),
            "rms_z": float(np.sqrt(np.mean(z**2))),
        }
    err = t - rows["mean_log10"].to_numpy()
    out["mean_abs_error_log10"] = float(np.mean(np.abs(err)))
    out["mean_error_log10"] = float(np.mean(err))
    out["median_cells"] = float(np.median(rows["n_cells"]))
    out["median_area_km2"] = float(np.median(rows["area_km2"]))
    return out


def verdict(s: dict[str, Any]) -> str:
    """One line: the target (90 +- 3% over at least 200 areas) met or not."""
    j = s["joint"]
    lo, hi = j["wilson95"]
    met = 0.87 <= j["coverage"] <= 0.93 and s["areas"] >= 200
    return (
        f"**Target (90 ± 3% coverage over at least 200 areas): {'met' if met else 'not met'}**: "
        f"{100 * j['coverage']:.1f}% of {s['areas']} areas (95% CI {100 * lo:.1f}–{100 * hi:.1f}%); "
        f"had the cells been independent: {100 * s['independent']['coverage']:.1f}%."
    )


def markdown(results: dict[str, Any], command: str) -> str:
    """The report for ``docs/benchmarks/areas.md``."""
    allr = results["all"]

    def line(label: str, s: dict[str, Any]) -> str:
        j, i = s["joint"], s["independent"]
        return (
            f"| {label} | {s['areas']} | {s['median_area_km2']:.0f} | {s['median_cells']:.0f} | "
            f"{100 * j['coverage']:.1f} ({100 * j['wilson95'][0]:.1f}–{100 * j['wilson95'][1]:.1f}) | "
            f"{j['mean_width_log10']:.3f} | {j['rms_z']:.2f} | "
            f"{100 * i['coverage']:.1f} ({100 * i['wilson95'][0]:.1f}–{100 * i['wilson95'][1]:.1f}) | "
            f"{i['mean_width_log10']:.4f} | {i['rms_z']:.1f} | {s['mean_abs_error_log10']:.3f} | "
            f"{s['mean_error_log10']:+.3f} |"
        )

    rows = [line(f"seed {k}", v) for k, v in results["per_seed"].items()]
    rows.append(line("**all**", allr))
    rows += [line(k, v) for k, v in results["by_density"].items()]
    cfg = results["config"]
    secs = results["seconds"]
    return "\n".join(
        [
            "# Area summaries: are the intervals honest?",
            "",
            "`benchmarks/bench_area_coverage.py`, a simulation study of `geodbk summarize` on the",
            "synthetic generator, whose true field is known (`geodbk.geo.synthetic.latent_field`).",
            "",
            "Setup, per generator seed: generate the synthetic region (`geodbk.geo.synthetic.generate`,",
            "`SyntheticConfig(seed=...)`: another seed is another region, towns, roads and gaps), ingest",
            "it as the demo does (mobile tiles 2023Q1–2023Q4, random split), train a time-aware DBK on",
            "download with the demo's settings but the training budget below and no tile effect (`time: true`, r = "
            f"{cfg['rank']}, h = {cfg['hidden']}, batch {cfg['batch_size']}, lr {cfg['lr']:g},",
            f"up to {cfg['epochs']} epochs, patience {cfg['patience']}, dPPGP, tests+devices noise, CPU), cut",
            f"the region into {results['areas_per_seed']} Voronoi cells of uniform random points",
            'clipped to the region (the region\'s "counties"), and run `geodbk summarize --quantity',
            f"area --samples {results['samples']}` at 2023Q4 on the default `geodbk predict` grid",
            "(zoom-16 cells). The truth of an area is the cos-latitude weighted mean of the true latent",
            "field (log10 kbps, 2023Q4) over the same cells the summary averages.",
            "",
            "| region | areas | median km² | median cells | joint 90% coverage (95% CI) | mean width | rms(z) | independent-cells coverage (95% CI) | mean width | rms(z) | mean abs error | mean error |",
            "|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|",
            *rows,
            "",
            "Coverage in %, widths in log10 units (a width w is a factor 10^w between the ends),",
            "`rms(z)`: the root mean square of (truth − mean) / sd, with sd = the interval's width /",
            "(2 × 1.645): 1 for an honest Gaussian interval. The binomial interval treats the areas as independent;",
            "within one region they are not (the model's error is spatially smooth), so the per-seed",
            "rows are the better guide to the spread. The last two rows split all areas at the median",
            "number of observed 2023Q4 tiles per km² (the summary's `n_tiles` / `area_km2`);",
            "`mean error` is truth − posterior mean.",
            "",
            "The model's own pointwise calibration of f at the same cells and at the 2023Q4",
            "observed tiles (coverage of the true field by mean ± 1.645 sd_f, and truth − mean):",
            "",
            "| seed | cells | f coverage at cells | mean error at cells | tiles | f coverage at tiles | mean error at tiles |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *[
                f"| {k} | {v['cells']} | {100 * v['cell_coverage90']:.1f} | "
                f"{v['cell_mean_error']:+.3f} | {v['tiles']} | {100 * v['tile_coverage90']:.1f} | "
                f"{v['tile_mean_error']:+.3f} |"
                for k, v in results["pointwise"].items()
            ],
            "",
            verdict(allr),
            "",
            "Command (run once, one thread; coverage does not depend on load):",
            "",
            "```bash",
            command,
            "```",
            "",
            f"Seconds per seed ({results['machine']}, one thread): "
            + "; ".join(
                f"seed {k}: " + ", ".join(f"{name} {v:.0f}" for name, v in s.items())
                for k, s in secs.items()
            )
            + ".",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("runs/areas_bench"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[20240, 20241, 20242])
    parser.add_argument("--areas", type=int, default=80, help="areas per seed")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument(
        "--epochs", type=int, default=400, help="training epochs (default 400, the seed's)"
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=400,
        help="early-stopping patience (default 400: none; the demo's is 10)",
    )
    parser.add_argument("--out", type=Path, default=None, help="markdown report")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite --out from WORK/results.json without running the study again",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        results = json.loads((args.work / "results.json").read_text())
        if args.out is not None:
            args.out.write_text(markdown(results, _command(args)), encoding="utf-8")
        return 0
    import torch

    torch.set_num_threads(1)
    all_rows, per_seed, seconds, pointwise = [], {}, {}, {}
    config: dict[str, Any] = {}
    for seed in args.seeds:
        res = one_seed(
            args.work,
            seed,
            n_areas=args.areas,
            samples=args.samples,
            epochs=args.epochs,
            patience=args.patience,
        )
        all_rows.append(res["rows"])
        per_seed[str(seed)] = score(res["rows"])
        seconds[str(seed)] = res["seconds"]
        pointwise[str(seed)] = res["pointwise"]
        config = res["config"]
        print(json.dumps({"seed": seed, **per_seed[str(seed)]}, indent=1))
    rows = pd.concat(all_rows, ignore_index=True)
    density = rows["n_tiles"] / rows["area_km2"]
    sparse = density <= density.median()
    results = {
        "all": score(rows),
        "by_density": {
            "fewer tiles per km²": score(rows[sparse]),
            "more tiles per km²": score(rows[~sparse]),
        },
        "per_seed": per_seed,
        "seconds": seconds,
        "pointwise": pointwise,
        "config": config,
        "areas_per_seed": args.areas,
        "samples": args.samples,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
    }
    print(json.dumps(results["all"], indent=1))
    args.work.mkdir(parents=True, exist_ok=True)
    rows.drop(columns=["geometry"], errors="ignore").to_csv(args.work / "areas.csv", index=False)
    (args.work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if args.out is not None:
        args.out.write_text(markdown(results, _command(args)), encoding="utf-8")
    return 0


def _command(args: argparse.Namespace) -> str:
    return (
        "OMP_NUM_THREADS=1 python benchmarks/bench_area_coverage.py --work "
        f"{args.work} --seeds {' '.join(map(str, args.seeds))} --areas {args.areas} "
        f"--samples {args.samples} --epochs {args.epochs} --patience {args.patience} "
        f"--out {args.out}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
