"""Does the local layer's spatial field earn its keep? The GP alone, the tile effect, the local
layer (tile effect + nearest-neighbour spatial field) and moving-window ordinary kriging of the
GP's residuals (PyKrige), side by side on one run's test split.

Needs a run directory with a trained GP (``geodbk train ... --no-tile-effect``; the layers are
fitted here on the same residuals, so every variant shares one GP)::

    OMP_NUM_THREADS=1 python benchmarks/bench_local_layer.py --run runs/ll/random \\
        --target download --out docs/benchmarks/local_layer/random_download.json

Fitting: the tile effect's ``(tau², rho, lambda, kappa)`` by the validation NLL of validation
rows with training history (random split) or, when too few validation rows have history
(tile and block splits), by an internal hold-out of one training row of a share of the
multi-row training tiles; the local layer's ``sigma²``, range and ``tau²`` by the validation
NLL (validation rows predicted from their own tile's training rows and their neighbours').
Both are then conditioned on the training and validation rows and scored on the test rows:

- row level: NLL (nats), 95% coverage and interval width, overall, urban and rural;
- map level (``map``): test tiles with at least 30 tests over their test quarters; the tile
  quantity at the tile's latest test quarter against the tile's tests-weighted level: 95%
  coverage, median |error| (log10) and the share off by more than 2x.

The kriging anchor: each training/validation tile's mean residual at its centre (km), an
exponential variogram fitted by PyKrige on a random 3,000 tiles, then ordinary kriging with the
16 closest tiles (``n_closest_points``; ``exact_values=False``, so a measured tile is smoothed
by the nugget). Its row variance is the kriging variance plus the GP's noise of the row's
tests less the GP's floor (the nugget holds the tile-level floor).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

Z95 = 1.959963984540054
LOG2 = math.log10(2.0)


def _rows(run: Path, target: str) -> pd.DataFrame:
    cols = ["quadkey", "quarter", "lon", "lat", "x1", "x2", "tests", "devices", "urban", "split"]
    frame = pd.read_parquet(run / "tiles.parquet", columns=[*cols, f"log10_{target}"])
    frame = frame.rename(columns={f"log10_{target}": "y"})
    return frame[np.isfinite(frame["y"])].reset_index(drop=True)


def _gp_parts(model: Any, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    from geodbk.geo.timeaxis import quarter_indices
    from geodbk.predictive import noise_kwargs

    X = frame[["x1", "x2"]].to_numpy(np.float64)
    kw = noise_kwargs(
        model,
        frame["tests"].to_numpy(np.float64),
        frame["devices"].clip(lower=1).to_numpy(np.float64),
        urban=frame["urban"].to_numpy(bool),
    )
    pred = model.predict(X, quantity="latent", **kw)
    names, comp = model.noise_components(n=len(frame), **kw)
    return {
        "mean": pred.mean,
        "var_f": pred.var_f,
        "comp": comp,
        "names": np.asarray(names),
        "residual": frame["y"].to_numpy() - pred.mean,
        "times": quarter_indices(frame["quarter"].astype(str).to_numpy()).astype(np.float64),
    }


def _scores(y: np.ndarray, mean: np.ndarray, var: np.ndarray, urban: np.ndarray) -> dict:
    z = (y - mean) / np.sqrt(var)
    nll = 0.5 * (np.log(2 * np.pi * var) + z**2)
    inside = np.abs(z) <= Z95
    out: dict[str, Any] = {"n": int(y.size)}
    for name, m in (("all", np.ones_like(urban)), ("urban", urban), ("rural", ~urban)):
        out[name] = {
            "nll": float(nll[m].mean()),
            "coverage95": float(inside[m].mean()),
            "width95": float((2 * Z95 * np.sqrt(var[m])).mean()),
        }
    return out


def _map_scores(
    test: pd.DataFrame,
    mean: np.ndarray,
    var: np.ndarray,
    noise: np.ndarray,
    *,
    min_tests: int = 30,
) -> dict:
    """The tile quantity against each test tile's tests-weighted level ``sum w y / sum w``
    (``w``: tests) over its test quarters. The prediction of that level is the same average of
    the tile quantity at each test row's quarter (mean ``sum w m / sum w``, sd ``sum w sd /
    sum w``: fully correlated quarters, the widest case), and the level's own noise
    ``sum w² n / (sum w)²`` (``n``: each row's observation noise under the same model) is
    added to its variance."""
    frame = test.assign(wm=test["tests"] * mean, wsd=test["tests"] * np.sqrt(var))
    frame["wy"] = frame["y"] * frame["tests"]
    frame["w2n"] = frame["tests"] ** 2 * noise
    g = frame.groupby("quadkey")
    total = g["tests"].sum()
    keep = total[total >= min_tests].index
    level = (g["wy"].sum() / total).loc[keep]
    pred = (g["wm"].sum() / total).loc[keep]
    sd = np.sqrt(((g["wsd"].sum() / total) ** 2 + g["w2n"].sum() / total**2).loc[keep])
    err = (pred - level).to_numpy()
    sd = sd.to_numpy()
    urban = g["urban"].last().loc[keep].to_numpy(bool)
    out: dict[str, Any] = {"tiles": int(keep.size), "min_tests": min_tests}
    for name, m in (("all", np.ones_like(urban)), ("urban", urban), ("rural", ~urban)):
        if not m.any():
            continue
        out[name] = {
            "tiles": int(m.sum()),
            "coverage95": float((np.abs(err[m]) <= Z95 * sd[m]).mean()),
            "median_abs_error": float(np.median(np.abs(err[m]))),
            "off_by_2x": float((np.abs(err[m]) > LOG2).mean()),
        }
    return out


def _holdout(tiles: np.ndarray, times: np.ndarray, *, seed: int, share: float = 0.2) -> np.ndarray:
    """One random row of ``share`` of the training tiles that have 2+ rows (bool mask)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"tile": tiles, "i": np.arange(tiles.size)})
    counts = frame.groupby("tile")["i"].transform("size").to_numpy()
    multi = np.unique(tiles[counts >= 2])
    chosen = set(rng.choice(multi, size=max(1, int(share * multi.size)), replace=False))
    pick = frame[frame["tile"].isin(chosen)].sample(frac=1.0, random_state=seed)
    first = pick.groupby("tile")["i"].first().to_numpy()
    mask = np.zeros(tiles.size, dtype=bool)
    mask[first] = True
    del times
    return mask


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; see the module docstring."""
    import torch

    from geodbk import DBKRegressor
    from geodbk.local_layer import LocalLayer, lonlat_to_km
    from geodbk.tile_effect import TileEffect, urban_groups

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--neighbours", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-kriging", action="store_true")
    p.add_argument(
        "--keep-total",
        action="store_true",
        help="the field takes a share of the tile effect's tau² instead of refitting tau²",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = DBKRegressor.load(args.run / "models" / args.target, device="cpu")
    frame = _rows(args.run, args.target)
    gp = _gp_parts(model, frame)
    frame["t"] = gp["times"]
    split = frame["split"].to_numpy()
    urban = frame["urban"].to_numpy(bool)
    groups = urban_groups(urban)
    lat0 = float(frame["lat"].mean())
    xy = lonlat_to_km(frame["lon"], frame["lat"], lat0=lat0)
    tiles = frame["quadkey"].astype(str).to_numpy()
    tr, va, te = (split == s for s in ("train", "val", "test"))

    def rows(m: np.ndarray) -> dict[str, Any]:
        return {
            "tiles": tiles[m],
            "times": gp["times"][m],
            "residual": gp["residual"][m],
            "var_f": gp["var_f"][m],
            "components": gp["comp"][m],
        }

    with_history = np.isin(tiles[va], tiles[tr])
    objective = "validation"
    fit_rows, obj_rows = tr.copy(), va & np.isin(tiles, tiles[tr])
    if with_history.sum() < 100:
        objective = "training hold-out"
        held = np.zeros(tiles.size, dtype=bool)
        held[np.flatnonzero(tr)[_holdout(tiles[tr], gp["times"][tr], seed=args.seed)]] = True
        fit_rows, obj_rows = tr & ~held, held
    names = tuple(str(n) for n in gp["names"])
    fit = rows(fit_rows)
    obj = rows(obj_rows)
    effect_fit = TileEffect.fit(
        tiles=fit["tiles"],
        times=fit["times"],
        residual=fit["residual"],
        var_f=fit["var_f"],
        components=fit["components"],
        val_tiles=obj["tiles"],
        val_times=obj["times"],
        val_residual=obj["residual"],
        val_var_f=obj["var_f"],
        val_components=obj["components"],
        component_names=names,
        groups=groups[fit_rows],
        val_groups=groups[obj_rows],
    )
    t_effect = time.perf_counter()
    # the effect on all training rows (same parameters), for the layer's fit on validation
    train = rows(tr)
    effect_train = TileEffect(effect_fit.params, **train, groups=groups[tr])

    def positions(effect: TileEffect) -> np.ndarray:
        known = effect._layout().tiles
        first = pd.Series(np.arange(tiles.size), index=tiles).groupby(level=0).first()
        return xy[first.loc[known].to_numpy()]

    val = rows(va)
    layer_train = LocalLayer.fit(
        effect_train,
        tile_xy=positions(effect_train),
        val_tiles=val["tiles"],
        val_xy=xy[va],
        val_times=val["times"],
        val_residual=val["residual"],
        val_var_f=val["var_f"],
        val_components=val["components"],
        val_groups=groups[va],
        lat0=lat0,
        neighbours=args.neighbours,
        keep_total=args.keep_total,
    )
    t_layer = time.perf_counter()
    both = tr | va
    effect_all = TileEffect(effect_fit.params, **rows(both), groups=groups[both])
    layer_all = layer_train.with_effect(effect_all, tile_xy=positions(effect_all))
    test = rows(te)
    y = frame["y"].to_numpy()[te]
    u = urban[te]
    gp_var_obs = gp["var_f"][te] + gp["comp"][te].sum(1)
    results: dict[str, Any] = {}
    # the GP alone: row = observation; map = area quantity (f, var_f)
    results["gp"] = {
        "rows": _scores(y, gp["mean"][te], gp_var_obs, u),
        "map": _map_scores(frame[te], gp["mean"][te], gp["var_f"][te], gp["comp"][te].sum(1)),
    }
    part = effect_all.predict(
        tiles=test["tiles"],
        times=test["times"],
        var_f=test["var_f"],
        components=test["components"],
        groups=groups[te],
    )
    results["tile_effect"] = {
        "rows": _scores(y, gp["mean"][te] + part.shift, part.tile_var + part.noise_var, u),
        "map": _map_scores(frame[te], gp["mean"][te] + part.shift, part.tile_var, part.noise_var),
        "test_rows_with_history": float(part.seen.mean()),
    }
    lpart, pull = layer_all.predict(
        tiles=test["tiles"],
        xy=xy[te],
        times=test["times"],
        var_f=test["var_f"],
        components=test["components"],
        groups=groups[te],
    )
    results["local_layer"] = {
        "rows": _scores(y, gp["mean"][te] + lpart.shift, lpart.tile_var + lpart.noise_var, u),
        "map": _map_scores(
            frame[te], gp["mean"][te] + lpart.shift, lpart.tile_var, lpart.noise_var
        ),
        "mean_abs_pull": float(np.abs(pull).mean()),
    }
    t_krige = None
    if not args.no_kriging:
        t1 = time.perf_counter()
        results["kriging"] = _kriging(frame, gp, xy, both, te, seed=args.seed)
        t_krige = time.perf_counter() - t1
    out = {
        "run": str(args.run),
        "target": args.target,
        "split": (json.loads((args.run / "ingest_report.json").read_text()).get("split") or {}),
        "rows": {"train": int(tr.sum()), "val": int(va.sum()), "test": int(te.sum())},
        "tile_effect": {**effect_fit.params.to_dict(), "objective": objective},
        "local_layer": {**layer_train.params.to_dict()},
        "results": results,
        "seconds": {
            "total": time.perf_counter() - t0,
            "tile_effect_fit": t_effect - t0,
            "local_layer_fit": t_layer - t_effect,
            "kriging": t_krige,
        },
        "machine": f"{platform.machine()} {platform.processor()}; torch threads 1",
        "command": "python benchmarks/bench_local_layer.py " + " ".join(argv or []),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, res in results.items():
        r, m = res["rows"]["all"], res["map"].get("all", {})
        print(
            f"{name:12s} NLL {r['nll']:.3f} cov {r['coverage95']:.3f} | map cov "
            f"{m.get('coverage95', float('nan')):.3f} med|err| "
            f"{m.get('median_abs_error', float('nan')):.3f} >2x {m.get('off_by_2x', float('nan')):.3f}"
        )
    return 0


def _kriging(
    frame: pd.DataFrame,
    gp: dict[str, np.ndarray],
    xy: np.ndarray,
    known: np.ndarray,
    test: np.ndarray,
    *,
    seed: int,
) -> dict[str, Any]:
    """Moving-window ordinary kriging of the GP's mean residual per tile (module docstring)."""
    from pykrige.ok import OrdinaryKriging

    per_tile = (
        pd.DataFrame(
            {
                "tile": frame["quadkey"].to_numpy()[known],
                "r": gp["residual"][known],
                "x": xy[known, 0],
                "y": xy[known, 1],
            }
        )
        .groupby("tile")
        .agg(r=("r", "mean"), x=("x", "first"), y=("y", "first"))
    )
    rng = np.random.default_rng(seed)
    sub = per_tile.iloc[rng.choice(len(per_tile), size=min(3000, len(per_tile)), replace=False)]
    probe = OrdinaryKriging(sub["x"], sub["y"], sub["r"], variogram_model="exponential", nlags=30)
    params = list(probe.variogram_model_parameters)
    ok = OrdinaryKriging(
        per_tile["x"],
        per_tile["y"],
        per_tile["r"],
        variogram_model="exponential",
        variogram_parameters=params,
        exact_values=False,
    )
    z, ss = ok.execute("points", xy[test, 0], xy[test, 1], backend="loop", n_closest_points=16)
    z, ss = np.asarray(z, dtype=np.float64), np.maximum(np.asarray(ss, dtype=np.float64), 1e-9)
    names = [str(n) for n in gp["names"]]
    comp = gp["comp"][test]
    floor = comp[:, names.index("floor")] if "floor" in names else 0.0
    row_noise = comp.sum(1) - floor
    y = frame["y"].to_numpy()[test]
    mean = gp["mean"][test] + z
    u = frame["urban"].to_numpy(bool)[test]
    return {
        "variogram": {"model": "exponential", "psill_range_nugget": [float(v) for v in params]},
        "rows": _scores(y, mean, ss + row_noise, u),
        "map": _map_scores(frame[test], mean, ss, row_noise),
    }


if __name__ == "__main__":
    raise SystemExit(main())
