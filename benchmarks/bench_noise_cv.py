"""K-fold cross-validated coverage by tests bucket (issue 9): every tile is a test tile once.

A single 10% test split leaves the rarest cells small (Hawaii mobile: 33 rural tiles with more
than 16 tests), where the binomial sd of a 95% rate is 3.8 points, so a ±2-point target cannot
be judged there. Here the finite-target rows are dealt into K random folds; for fold k the model
trains on the other folds minus fold k+1 (validation: best epoch by validation NLL) and predicts
fold k. The K held-out predictions are pooled and scored overall, urban/rural and by tests
bucket (:func:`pipelines.scoring.by_tests_scores`), so each cell has about K times the rows of
one test split.

Variants (tests-aware ``DBKRegressor``, r = 256, h = 64, batch 512, 150 epochs, patience 20
unless changed): ``pooled`` (inputs [x1, x2], s2_i = s2_floor + s2_meas / tests_i, the
``geodbk train`` default), ``time`` (inputs [x1, x2, t] as ``--time``), ``time-power`` (``time``
plus a learned power, s2_meas / tests_i^p), and ``pooled-devices`` / ``time-power-devices`` (the
``tests+devices`` noise, ``+ s2_dev / devices_i^q``), ``time-devices`` (p = q = 1), and
``pooled-devices-urban`` / ``time-devices-urban`` / ``time-power-devices-urban`` (those with a
noise floor per urban/rural class, ``noise_urban``). Each (variant, fold) is one process, so the folds can
run in parallel (set ``OMP_NUM_THREADS=1`` for each)::

    for k in $(seq 0 9); do OMP_NUM_THREADS=1 python benchmarks/bench_noise_cv.py fold \\
        --run runs/hawaii-mobile --variant time-power --fold $k --out runs/cv & done; wait
    python benchmarks/bench_noise_cv.py pool --out runs/cv --variant time-power

``fold`` writes ``OUT/VARIANT_fold_K.npz`` (row index, mean, variance, validation NLL); ``pool``
writes ``OUT/VARIANT.json`` and prints the bucket table and, for each urban/rural cell outside
95 ± 2%, the tiles that hold most of its misses. ``--seed S`` deals the rows into other folds
and initialises the model with ``S`` (a second cross-validation seed; use its own ``--out``).

``--tile-effect`` adds the per-tile offset (:mod:`geodbk.tile_effect`, fitted on the fold's
validation rows and conditioned on each tile's train and validation quarters); the results go
to ``VARIANT-tile_*``, whose ``.npz`` also keeps the GP's own predictions (``mean_gp``,
``var_gp``) and its latent mean, variance and noise components at every row, so that
``tile --fold K`` refits the tile effect alone, without retraining the GP. ``local --fold K``
fits the local layer (:func:`pipelines.layers.fit_local_layer`: the tile effect plus the
nearest-neighbour spatial field, as ``geodbk train`` fits it) from the same saved latents
(``VARIANT-local_*``; ``pool --local-layer`` scores it)::

    for k in $(seq 0 9); do OMP_NUM_THREADS=1 python benchmarks/bench_noise_cv.py local \
        --run RUN --variant pooled-devices --fold $k --out runs/cv; done
    python benchmarks/bench_noise_cv.py pool --run RUN --variant pooled-devices --out runs/cv \
        --local-layer
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.metrics import COVERAGE95

VARIANTS: dict[str, dict[str, bool]] = {
    "pooled": {"time": False, "noise_power": False, "devices": False},
    "time": {"time": True, "noise_power": False, "devices": False},
    "time-power": {"time": True, "noise_power": True, "devices": False},
    "pooled-devices": {"time": False, "noise_power": False, "devices": True},
    "time-power-devices": {"time": True, "noise_power": True, "devices": True},
    "time-devices": {"time": True, "noise_power": False, "devices": True},
    "pooled-devices-urban": {"time": False, "noise_power": False, "devices": True, "urban": True},
    "time-devices-urban": {"time": True, "noise_power": False, "devices": True, "urban": True},
    "time-power-devices-urban": {
        "time": True,
        "noise_power": True,
        "devices": True,
        "urban": True,
    },
}
COLUMNS = ["quadkey", "x1", "x2", "quarter", "tests", "devices", "urban"]


def load_rows(run: Path, target: str) -> pd.DataFrame:
    """The rows of ``RUN/tiles.parquet`` with a finite ``log10_TARGET`` (read without geometry)."""
    col = f"log10_{target}"
    table = pd.read_parquet(run / "tiles.parquet", columns=[*COLUMNS, col])
    ok = np.isfinite(table[col].to_numpy(dtype=np.float64))
    return table[ok].reset_index(drop=True)


def fold_ids(n: int, *, folds: int, seed: int) -> np.ndarray:
    """Row -> fold, a seeded random deal of ``n`` rows into ``folds`` near-equal folds."""
    return np.random.default_rng(seed).permutation(n) % folds


def run_fold(args: argparse.Namespace) -> dict[str, Any]:
    """Fit the variant on the other folds and predict fold ``args.fold``; save the predictions."""
    from geodbk import DBKRegressor
    from geodbk.geo.timeaxis import TimeScaling

    rows = load_rows(Path(args.run), args.target)
    train, val, test = fold_masks(len(rows), args)
    opts = VARIANTS[args.variant]
    X = rows[["x1", "x2"]].to_numpy(dtype=np.float64)
    if opts["time"]:
        scaling = TimeScaling.from_quarters(rows.loc[train, "quarter"].astype(str))
        X = np.column_stack([X, scaling.scale(rows["quarter"].astype(str).to_numpy())])
    y = rows[f"log10_{args.target}"].to_numpy(dtype=np.float64)
    tests = np.maximum(rows["tests"].to_numpy(dtype=np.float64), 1.0)
    devices = np.maximum(np.nan_to_num(rows["devices"].to_numpy(dtype=np.float64), nan=1.0), 1.0)
    model = DBKRegressor(
        rank=args.rank,
        hidden=args.hidden,
        epochs=args.epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        noise="tests+devices" if opts["devices"] else "tests",
        noise_init=0.5,
        noise_power=opts["noise_power"],
        noise_urban=opts.get("urban", False),
        device=args.device,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    fit_kw: dict[str, Any] = {"tests": tests[train], "tests_val": tests[val]}
    predict_kw: dict[str, Any] = {"tests": tests[test]}
    noise_all: dict[str, Any] = {"tests": tests}
    if opts["devices"]:
        fit_kw |= {"devices": devices[train], "devices_val": devices[val]}
        predict_kw["devices"] = devices[test]
        noise_all["devices"] = devices
    if opts.get("urban", False):
        urban = rows["urban"].to_numpy(dtype=bool)
        fit_kw |= {"urban": urban[train], "urban_val": urban[val]}
        predict_kw["urban"] = urban[test]
        noise_all["urban"] = urban
    model.fit(X[train], y[train], X[val], y[val], **fit_kw)
    pred = model.predict_dist(X[test], **predict_kw)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    val_nll = min(h["val_nll"] for h in model.history_)
    extra: dict[str, Any] = {}
    if args.tile_effect:
        extra = tile_effect_fold(
            model, rows, X, y, (train, val, test), noise_all, tile_groups(rows, args)
        )
        extra |= {"mean_gp": pred.mean, "var_gp": pred.var}
        pred = extra.pop("prediction")
    np.savez(
        out / f"{run_name(args)}_fold_{args.fold}.npz",
        index=np.flatnonzero(test),
        mean=pred.mean,
        var=pred.var,
        val_nll=val_nll,
        best_epoch=model.best_epoch_,
        seconds=time.perf_counter() - t0,
        **extra,
    )
    return {"variant": run_name(args), "fold": args.fold, "val_nll": val_nll}


def run_name(args: argparse.Namespace) -> str:
    """File stem of a variant's results: ``VARIANT``, or with the tile effect ``VARIANT-tile``
    plus ``u`` (``tile --by-urban``: each noise term rescaled per class) and ``g``
    (``--groups urban``: a tau² per class), e.g. ``VARIANT-tileg``."""
    if getattr(args, "local_layer", False):
        return f"{args.variant}-local" + ("-keeprho" if getattr(args, "keep_rho", False) else "")
    if not args.tile_effect:
        return args.variant
    suffix = ("u" if getattr(args, "by_urban", False) else "") + (
        "g" if getattr(args, "groups", "none") == "urban" else ""
    )
    return f"{args.variant}-tile{suffix}"


def tile_groups(rows: pd.DataFrame, args: argparse.Namespace) -> np.ndarray | None:
    """Each row's tile group for ``--groups urban`` (None: one tau² for every tile)."""
    from geodbk.tile_effect import urban_groups

    return urban_groups(rows["urban"].to_numpy(dtype=bool)) if args.groups == "urban" else None


def tile_effect_fold(
    model: Any,
    rows: pd.DataFrame,
    X: np.ndarray,
    y: np.ndarray,
    masks: tuple[np.ndarray, np.ndarray, np.ndarray],
    noise_all: dict[str, np.ndarray],
    groups: np.ndarray | None = None,
) -> dict[str, Any]:
    """The GP's latent mean, variance and noise components at every row (saved, so that
    ``tile`` can refit the tile effect without retraining), plus the tile effect's prediction
    of the test rows (:func:`tile_effect_from_latents`)."""
    pred = model.predict_dist(X, quantity="latent", **noise_all)
    names, comp = model.noise_components(n=len(y), **noise_all)
    latents = {
        "latent_mean": pred.mean,
        "latent_var": pred.var_f,
        "components": comp,
        "component_names": np.array(names),
    }
    return tile_effect_from_latents(rows, y, latents, masks, groups) | latents


def fold_tile_effect(
    rows: pd.DataFrame,
    y: np.ndarray,
    latents: dict[str, Any],
    masks: tuple[np.ndarray, np.ndarray, np.ndarray],
    groups: np.ndarray | None = None,
) -> tuple[Any, Callable[[np.ndarray], dict[str, Any]]]:
    """The fold's tile effect: :meth:`geodbk.tile_effect.TileEffect.fit` on the train
    residuals ``y - latent_mean`` (parameters by the validation rows), conditioned then on the
    train and validation quarters of each tile (time step: the quarter index); with the
    function that gives the effect's row arguments of a row mask."""
    from geodbk.geo.timeaxis import quarter_indices
    from geodbk.tile_effect import TileEffect

    train, val, _ = masks
    tiles = rows["quadkey"].astype(str).to_numpy()
    times = quarter_indices(rows["quarter"].astype(str)).astype(np.float64)
    residual = y - latents["latent_mean"]
    var_f, comp = latents["latent_var"], latents["components"]

    def part(mask: np.ndarray) -> dict[str, Any]:
        return {
            "tiles": tiles[mask],
            "times": times[mask],
            "residual": residual[mask],
            "var_f": var_f[mask],
            "components": comp[mask],
            "groups": None if groups is None else groups[mask],
        }

    effect = TileEffect.fit(
        **part(train),
        **{f"val_{k}": v for k, v in part(val).items()},
        component_names=[str(c) for c in latents["component_names"]],
    ).with_rows(**part(val))
    return effect, part


def tile_effect_from_latents(
    rows: pd.DataFrame,
    y: np.ndarray,
    latents: dict[str, Any],
    masks: tuple[np.ndarray, np.ndarray, np.ndarray],
    groups: np.ndarray | None = None,
) -> dict[str, Any]:
    """Fit the tile effect on the fold's train/validation rows (:func:`fold_tile_effect`)
    and predict its test rows (``groups``: each row's tile group, one tau² per group);
    returns the prediction and the fitted parameters for the ``.npz``."""
    from geodbk.predictive import Prediction

    test = masks[2]
    t0 = time.perf_counter()
    effect, part = fold_tile_effect(rows, y, latents, masks, groups)
    test_rows = part(test)
    test_rows.pop("residual")
    got = effect.predict(**test_rows)
    pred = Prediction(
        mean=latents["latent_mean"][test] + got.shift,
        var=got.tile_var + got.noise_var,
        var_f=got.tile_var,
    )
    p = effect.params
    return {
        "prediction": pred,
        "tile_tau2": np.array(list(p.tau2.values())),
        "tile_groups": np.array(p.groups),
        "tile_rho": p.rho,
        "tile_latent_scale": p.latent_scale,
        "tile_noise_scale": np.array(p.noise_scale),
        "tile_val_nll": p.val_nll,
        "tile_val_nll_without": p.val_nll_without,
        "tile_seconds": time.perf_counter() - t0,
    }


def refit_tile_effect(args: argparse.Namespace) -> dict[str, Any]:
    """Refit the tile effect of one fold from its saved latents (no GP retraining)."""
    rows = load_rows(Path(args.run), args.target)
    train, val, test = fold_masks(len(rows), args)
    # the GP latents are the same in every tile-effect file of the fold
    src = next(
        path
        for stem in ("tile", "tileg")
        if (path := Path(args.out) / f"{args.variant}-{stem}_fold_{args.fold}.npz").is_file()
    )
    saved = dict(np.load(src))
    y = rows[f"log10_{args.target}"].to_numpy(dtype=np.float64)
    latents = dict(saved)
    if args.by_urban:  # each noise term rescaled separately for urban and rural tiles
        u = rows["urban"].to_numpy(dtype=float)[:, None]
        names = [str(c) for c in saved["component_names"]]
        latents["components"] = np.hstack([saved["components"] * u, saved["components"] * (1 - u)])
        latents["component_names"] = np.array(
            [f"{c}_urban" for c in names] + [f"{c}_rural" for c in names]
        )
    extra = tile_effect_from_latents(rows, y, latents, (train, val, test), tile_groups(rows, args))
    pred = extra.pop("prediction")
    out = Path(args.out) / f"{run_name(args)}_fold_{args.fold}.npz"
    np.savez(out, **(saved | extra | {"mean": pred.mean, "var": pred.var}))
    return {"variant": run_name(args), "fold": args.fold, "tile_val_nll": extra["tile_val_nll"]}


def refit_local_layer(args: argparse.Namespace) -> dict[str, Any]:
    """The local layer of one fold from its saved GP latents (no GP retraining): the tile
    effect refitted as ``tile`` does (:func:`fold_tile_effect`), then
    :func:`pipelines.layers.fit_local_layer` on the fold's validation rows, conditioned on its
    train and validation rows, predicting its test rows (each at its tile's centre). Writes
    ``VARIANT-local_fold_K.npz``."""
    from geodbk.predictive import Prediction
    from pipelines.layers import ValidationRows, fit_local_layer, tile_positions

    rows = load_rows(Path(args.run), args.target)
    train, val, test = fold_masks(len(rows), args)
    saved = dict(np.load(Path(args.out) / f"{args.variant}-tileg_fold_{args.fold}.npz"))
    y = rows[f"log10_{args.target}"].to_numpy(dtype=np.float64)
    groups = tile_groups(rows, args)
    mean_f, var_f, comp = saved["latent_mean"], saved["latent_var"], saved["components"]
    t0 = time.perf_counter()
    effect, part = fold_tile_effect(rows, y, saved, (train, val, test), groups)
    at_val = part(val)
    validation = ValidationRows(
        X=np.empty((int(val.sum()), 0)),
        y=y[val],
        tiles=at_val["tiles"],
        times=at_val["times"],
        noise={},
        groups=at_val["groups"],
        tests=np.maximum(rows["tests"].to_numpy(dtype=np.float64), 1.0)[val],
        urban=rows["urban"].to_numpy(dtype=bool)[val],
    )
    latent = Prediction(mean=mean_f[val], var=var_f[val], var_f=var_f[val])
    layer = fit_local_layer(
        effect,
        n_train=int(train.sum()),
        val=validation,
        pred=latent,
        components=comp[val],
        fit_rho=not args.keep_rho,
    )
    test_rows = part(test)
    test_rows.pop("residual")
    p = layer.params
    got = layer.predict(
        **test_rows, xy=tile_positions(test_rows["tiles"], lat0=p.lat0, lon0=p.lon0)
    )
    extra = {
        "mean": mean_f[test] + got.shift,
        "var": got.tile_var + got.noise_var,
        "local_sigma2": p.sigma2,
        "local_range_km": p.range_km,
        "local_rho": np.array(list((p.rho or {}).values())),
        "local_val_nll": p.val_nll,
        "local_val_nll_without": p.val_nll_without,
        "local_seconds": time.perf_counter() - t0,
    }
    out = Path(args.out) / f"{run_name(args)}_fold_{args.fold}.npz"
    np.savez(out, **(saved | extra))
    return {"variant": run_name(args), "fold": args.fold, "local_val_nll": p.val_nll}


def fold_masks(n: int, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) row masks of fold ``args.fold``: test = the fold, val = the next."""
    ids = fold_ids(n, folds=args.folds, seed=args.seed)
    test = ids == args.fold
    val = ids == (args.fold + 1) % args.folds
    return ~test & ~val, val, test


def coverage_intervals(
    y: np.ndarray, mean: np.ndarray, sd: np.ndarray, urban: np.ndarray, tests: np.ndarray,
    tile: np.ndarray,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per tests bucket and urban/rural cell: ``{"tiles", "ci", "ez2", "kurtosis",
    "coverage_at_ez2_1"}``: distinct tiles, the tile-clustered 95% interval of the coverage
    (:func:`clustered_coverage_interval`), and the residual shape of ``z = (y - mean) / sd``:
    ``E[z²]`` (1 when the variance is right on average), ``E[z⁴] / E[z²]²`` and the coverage
    the cell would have with its variance rescaled to ``E[z²] = 1``; ``misses`` (rows outside
    their 95% interval) and ``top_miss_tiles``, the 4 tiles holding the most of them, each with
    its rows, misses and the spread (max - min) of its target over the quarters."""
    from pipelines.scoring import bucket_masks, clustered_coverage_interval

    hit = np.abs(y - mean) <= 1.96 * sd
    out: dict[str, dict[str, Any]] = {}
    for bucket, mask in bucket_masks(tests).items():
        out[bucket] = {}
        for name, cls in (("urban", urban), ("rural", ~urban)):
            m = mask & cls
            if m.sum() == 0:
                continue
            z = (y[m] - mean[m]) / sd[m]
            ez2 = float(np.mean(z**2))
            out[bucket][name] = {
                "tiles": int(np.unique(tile[m]).size),
                "ci": clustered_coverage_interval(hit[m], tile[m]),
                "ez2": ez2,
                "kurtosis": float(np.mean(z**4) / ez2**2),
                "coverage_at_ez2_1": float(np.mean(np.abs(z) <= 1.96 * np.sqrt(ez2))),
                "misses": int((~hit[m]).sum()),
                "top_miss_tiles": top_miss_tiles(y[m], hit[m], tile[m]),
            }
    return out


def top_miss_tiles(
    y: np.ndarray, hit: np.ndarray, tile: np.ndarray, *, k: int = 4
) -> list[dict[str, Any]]:
    """The ``k`` tiles with the most rows outside their interval (ties: the tile id), each
    ``{"tile", "rows", "misses", "y_spread"}`` (``y_spread``: max - min of its rows' target)."""
    frame = pd.DataFrame({"tile": tile, "miss": ~hit, "y": y})
    per = frame.groupby("tile").agg(
        rows=("miss", "size"), misses=("miss", "sum"), y_max=("y", "max"), y_min=("y", "min")
    )
    per = per[per["misses"] > 0].sort_values(["misses", "rows"], ascending=[False, False])
    return [
        {
            "tile": str(name),
            "rows": int(r.rows),
            "misses": int(r.misses),
            "y_spread": float(r.y_max - r.y_min),
        }
        for name, r in per.head(k).iterrows()
    ]


def pool(args: argparse.Namespace) -> dict[str, Any]:
    """Pool the folds' held-out predictions and score them by tests bucket, urban and rural."""
    from pipelines.scoring import by_tests_scores, clean_json, urban_rural_scores

    rows = load_rows(Path(args.run), args.target)
    n = len(rows)
    mean, var = np.full(n, np.nan), np.full(n, np.nan)
    val_nll, done = [], []
    tile: list[dict[str, Any]] = []
    for k in range(args.folds):
        path = Path(args.out) / f"{run_name(args)}_fold_{k}.npz"
        if not path.is_file():
            continue
        part = np.load(path)
        mean[part["index"]], var[part["index"]] = part["mean"], part["var"]
        val_nll.append(float(part["val_nll"]))
        done.append(k)
        if "tile_tau2" in part:
            tile.append(
                {key[5:]: part[key].tolist() for key in part.files if key.startswith("tile_")}
            )
    have = np.isfinite(mean)
    y = rows[f"log10_{args.target}"].to_numpy(dtype=np.float64)[have]
    urban = rows["urban"].to_numpy(dtype=bool)[have]
    tests = np.maximum(rows["tests"].to_numpy(dtype=np.float64), 1.0)[have]
    sd = np.sqrt(var[have])
    report = {
        "variant": run_name(args),
        "target": args.target,
        "folds": args.folds,
        "folds_scored": done,
        "rows_scored": int(have.sum()),
        "val_nll_mean": float(np.mean(val_nll)) if val_nll else None,
        "val_nll_folds": val_nll,
        "scores": urban_rural_scores(y, mean[have], sd, urban, sd_train=float(np.std(y))),
        "by_tests": by_tests_scores(y, mean[have], sd, urban, tests),
        "coverage_intervals": coverage_intervals(
            y, mean[have], sd, urban, tests, rows["quadkey"].to_numpy()[have]
        ),
    }
    if tile:
        report["tile_effect_folds"] = tile
        print(
            "tile effect over folds: "
            + ", ".join(
                f"{key} {np.mean([f[key] for f in tile], axis=0)}"
                for key in (
                    "tau2",
                    "rho",
                    "latent_scale",
                    "noise_scale",
                    "val_nll",
                    "val_nll_without",
                )
            )
        )
    report = clean_json(report)
    (Path(args.out) / f"{run_name(args)}.json").write_text(json.dumps(report, indent=1))
    for bucket, s in report["by_tests"].items():
        ci = report["coverage_intervals"][bucket]
        cells = ", ".join(
            f"{c} {100 * s[c][COVERAGE95]:.1f}% n {s[c]['n']} tiles {ci[c]['tiles']} "
            f"[{100 * ci[c]['ci'][0]:.1f}, {100 * ci[c]['ci'][1]:.1f}] E[z2] {ci[c]['ez2']:.2f} "
            f"kurt {ci[c]['kurtosis']:.1f} at E[z2]=1 {100 * ci[c]['coverage_at_ez2_1']:.1f}%"
            for c in ("urban", "rural")
            if c in ci
        )
        print(
            f"{run_name(args)} {bucket:>5}: n {s['n']:5d} coverage {100 * s[COVERAGE95]:.1f}% ({cells})"
        )
        for c in ("urban", "rural"):
            cell = ci.get(c)
            if cell and abs(s[c][COVERAGE95] - 0.95) > 0.02 and cell["misses"]:
                top = cell["top_miss_tiles"]
                print(
                    f"    {c} {bucket} outside 95 +- 2%: {cell['misses']} misses, the top "
                    f"{len(top)} tiles hold {sum(t['misses'] for t in top)}: "
                    + "; ".join(
                        f"{t['tile']} {t['misses']}/{t['rows']} rows, spread {t['y_spread']:.2f}"
                        for t in top
                    )
                )
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line: ``fold`` (one fit) or ``pool`` (score the pooled folds)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["fold", "pool", "tile", "local"])
    p.add_argument("--run", required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--variant", default="time-power", choices=sorted(VARIANTS))
    p.add_argument("--folds", type=int, default=10)
    p.add_argument("--fold", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=150)
    p.add_argument("--patience", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--tile-effect",
        action="store_true",
        help="add the per-tile offset (geodbk.tile_effect) fitted on the fold's validation "
        "rows; results go to VARIANT-tile_*",
    )
    p.add_argument(
        "--by-urban",
        action="store_true",
        help="with `tile`: rescale each noise term separately for urban and rural tiles "
        "(results VARIANT-tileu_*); with `pool`: score those",
    )
    p.add_argument(
        "--groups",
        choices=["urban", "none"],
        default="urban",
        help="with the tile effect: a tau² per urban/rural class (default, as `geodbk train`; "
        "results VARIANT-tileg_*) or one for every tile (`none`: VARIANT-tile_*)",
    )
    p.add_argument(
        "--local-layer",
        action="store_true",
        help="with `pool`: score the local layer's predictions (VARIANT-local_*, written by "
        "`local` from a `fold --tile-effect` file)",
    )
    p.add_argument(
        "--keep-rho",
        action="store_true",
        help="with `local` and `pool --local-layer`: keep the tile effect's rho in the local "
        "layer (results VARIANT-local-keeprho_*)",
    )
    args = p.parse_args(argv)
    if args.what == "local":
        args.local_layer = True
        print(json.dumps(refit_local_layer(args)), file=sys.stderr)
        return 0
    if args.what == "tile":
        args.tile_effect = True
        print(json.dumps(refit_tile_effect(args)), file=sys.stderr)
        return 0
    result = run_fold(args) if args.what == "fold" else pool(args)
    if args.what == "fold":
        print(json.dumps(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
