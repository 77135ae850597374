"""Does the local layer's spatial field earn its keep? The GP alone, the tile effect, the local
layer (tile effect + nearest-neighbour spatial field) and moving-window ordinary kriging of the
GP's residuals (PyKrige), side by side on one run's test split.

Needs a run directory with a trained GP (``geodbk train ... --no-tile-effect``; the layers are
fitted here on the same residuals, so every variant shares one GP)::

    OMP_NUM_THREADS=1 python benchmarks/bench_local_layer.py --run runs/ll/random-download-pooled \\
        --target download --out docs/benchmarks/local_layer/random-download-pooled.json

``--table DIR`` prints the markdown table of every JSON in ``DIR`` (docs/decisions/local_layer.md; the
local layer's row names its place share and the prior of an unmeasured tile it chose, the
tile effect's ``τ²`` or the GP's; under it, per model, the runs whose coverage interval holds
95%, by tile and by place);
``--place-shares DIR`` how the place share moves the map coverage on block-split runs (the
chosen share against the rule without the conformal count, pooled per target; docs/decisions/local_layer.md,
"Can a block split learn the place share?");
``--summary DIR`` the one-line-per-run table of docs/decisions/local_layer.md's seed-size section from the
``RUN.json`` / ``RUN.no_shift.json`` pairs (and ``history_RUN.csv``) of ``gpu_tile_maps.sh``;
``--neighbours-table DIR`` the local layer at each ``--neighbours K`` from ``RUN.kK.json`` files;
``--spread-table DIR`` the ``neighbour_spread_study`` of every JSON in ``DIR``;
``--spacing RUN`` how close together a run's measured tiles lie (docs/decisions/local_layer.md, both in
"How many neighbours").

Fitting is what ``geodbk train`` does (:func:`geodbk.tile_effect.fit_tile_effect`,
:func:`pipelines.layers.fit_run_local_layer`): the tile effect's ``(tau², rho, lambda,
kappa)`` by the validation NLL of validation rows with training history (random split) or, when
too few validation rows have history (tile and block splits), by a hold-out of one training row
of 20% of the multi-row training tiles; the local layer's share of ``tau²`` and range by the
validation NLL (validation rows predicted from their own tile's training rows and their
neighbours'), and the place share of each (the tile effect's as ``geodbk train
--no-local-layer`` chooses it) on the validation tiles without training rows
(:func:`pipelines.layers.choose_place_share`). Both are conditioned on the training and
validation rows and scored on the test rows; ``local_layer_c1`` and ``tile_effect_c1`` are the
same models with the place share 1 (the same rows; their maps keep an unmeasured tile's whole
prior):

- row level: NLL (nats), 95% coverage and interval width, overall, urban and rural;
- map level (``map``, :mod:`pipelines.map_calibration`, as the report's ``map_calibration``):
  test tiles with at least 30 tests over their test quarters, the quantity (tile, or f for the
  GP alone) against the tile's tests-weighted level: 95% coverage with its interval over the
  tiles and counted by place (:func:`geodbk.geo.blocks.calibration_places`), median |error|
  (log10) and the share off by more than 2x; ``less_measured``, the same on test tiles with
  5–29 tests (the report's ``tile_less_measured``; the last column of ``--table``).
- the local layer's ``unseen_prior_study``: its field under each prior of an unmeasured tile,
  the validation NLL of rows without training history by urban / rural, the test map at the
  chosen place share and at 1, and the test tiles its interval misses;
  ``unseen_rows_prior_below_latent``: the share of unmeasured test rows whose prior is below
  ``lambda v_f`` (no offset for the place share to scale);
  ``neighbour_spread_study``: whether test tiles without rows err more where their measured
  neighbours stray more than the layer says (a case for a locally scaled prior).

The kriging anchor: each training/validation tile's mean residual at its centre (km), an
exponential variogram fitted by PyKrige on a random 3,000 tiles, then ordinary kriging with the
16 closest tiles (``n_closest_points``; ``exact_values=False``, so a measured tile is smoothed
by the nugget). Its row variance is the kriging variance plus the GP's noise of the row's
tests less the GP's floor (the nugget holds the tile-level floor).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk.geo.blocks import calibration_places, held_out_units
from geodbk.geo.table import read_table_metadata
from geodbk.metrics import (
    COVERAGE95,
    COVERAGE95_INTERVAL,
    COVERAGE95_INTERVAL_BY_PLACE,
    MEDIAN_ABS_ERROR,
    NLL,
    OFF_BY_2X,
    PLACES,
    WIDTH95,
    canonical_keys,
    coverage_verdict,
    share_interval,
)
from geodbk.tile_effect import UNSEEN_GP

Z95 = 1.959963984540054


def _rows(run: Path, target: str) -> pd.DataFrame:
    cols = ["quadkey", "quarter", "lon", "lat", "x1", "x2", "tests", "devices", "urban", "split"]
    frame = pd.read_parquet(run / "tiles.parquet", columns=[*cols, f"log10_{target}"])
    frame = frame.rename(columns={f"log10_{target}": "y"})
    frame = frame[np.isfinite(frame["y"])].reset_index(drop=True)
    frame["place"] = calibration_places(
        frame["quadkey"].to_numpy(),
        lon=frame["lon"].to_numpy(),
        lat=frame["lat"].to_numpy(),
        split=read_table_metadata(run / "tiles.parquet").get("split"),
    )
    return frame


def _gp_parts(model: Any, frame: pd.DataFrame) -> dict[str, Any]:
    """The GP's latent mean and variance, noise components and the row inputs."""
    from geodbk.geo.timeaxis import quarter_indices
    from geodbk.predictive import noise_kwargs
    from pipelines.rundir import model_inputs

    md = model.metadata_
    quarters = frame["quarter"].astype(str).to_numpy()
    X = model_inputs(
        frame[["x1", "x2"]].to_numpy(np.float64),
        md,
        quarter=quarters if md.get("time_scaling") else None,
    )
    noise = noise_kwargs(
        model,
        frame["tests"].to_numpy(np.float64),
        frame["devices"].clip(lower=1).to_numpy(np.float64),
        urban=frame["urban"].to_numpy(bool),
    )
    pred = model.predict_dist(X, quantity="latent", **noise)
    names, comp = model.noise_components(n=len(frame), **noise)
    return {
        "X": X,
        "noise": noise,
        "mean": pred.mean,
        "var_f": pred.var_f,
        "comp": comp,
        "names": np.asarray(names),
        "residual": frame["y"].to_numpy() - pred.mean,
        "times": quarter_indices(quarters).astype(np.float64),
    }


def fit_run_tile_effect(
    model: Any, frame: pd.DataFrame, gp: dict[str, Any], *, seed: int = 0, **options: Any
) -> Any:
    """:func:`geodbk.tile_effect.fit_tile_effect` on the run's training and validation rows,
    exactly as ``geodbk train`` fits it (its objective chosen by the split); ``options`` go
    to it (e.g. ``persistent=True``)."""
    from geodbk.tile_effect import fit_tile_effect, urban_groups

    split = frame["split"].to_numpy()
    tr, va = split == "train", split == "val"
    groups = urban_groups(frame["urban"].to_numpy(bool))
    tiles = frame["quadkey"].astype(str).to_numpy()
    y = frame["y"].to_numpy()

    def noise(m: np.ndarray) -> dict[str, Any]:
        return {k: np.asarray(v)[m] for k, v in gp["noise"].items()}

    return fit_tile_effect(
        model,
        X=gp["X"][tr],
        y=y[tr],
        tiles=tiles[tr],
        times=gp["times"][tr],
        X_val=gp["X"][va],
        y_val=y[va],
        tiles_val=tiles[va],
        times_val=gp["times"][va],
        noise=noise(tr),
        noise_val=noise(va),
        groups=groups[tr],
        groups_val=groups[va],
        seed=seed,
        **options,
    )


def layer_at_share(layer: Any, c: float) -> Any:
    """``layer`` (a :class:`geodbk.local_layer.LocalLayer`) with one place share ``c`` for
    every tile."""
    from geodbk.local_layer import LocalLayer

    return LocalLayer(
        layer.effect,
        replace(layer.params, place_share=float(c), place_share_by_group=None),
        tile_xy=layer.tile_xy,
        positions=layer.positions,
    )


def validation_rows(run: Path, frame: pd.DataFrame, gp: dict[str, Any]) -> Any:
    """The run's validation rows as ``geodbk train``'s post-fit steps read them
    (:class:`pipelines.layers.ValidationRows`; ``frame`` from :func:`_rows`, ``gp`` from
    :func:`_gp_parts`), each row's held-out unit from the split's metadata."""
    from geodbk.tile_effect import urban_groups
    from pipelines.layers import ValidationRows

    va = frame["split"].to_numpy() == "val"
    urban = frame["urban"].to_numpy(bool)
    return ValidationRows(
        X=gp["X"][va],
        y=frame["y"].to_numpy()[va],
        tiles=frame["quadkey"].astype(str).to_numpy()[va],
        times=gp["times"][va],
        noise={k: np.asarray(v)[va] for k, v in gp["noise"].items()},
        groups=urban_groups(urban)[va],
        tests=frame["tests"].to_numpy(np.float64)[va],
        urban=urban[va],
        units=held_out_units(
            frame["lon"].to_numpy()[va],
            frame["lat"].to_numpy()[va],
            read_table_metadata(run / "tiles.parquet").get("split"),
        ),
    )


def _scores(
    y: np.ndarray, mean: np.ndarray, var: np.ndarray, urban: np.ndarray, tests: np.ndarray
) -> dict:
    """NLL, 95% coverage and width overall, urban and rural, and by tests bucket."""
    from pipelines.scoring import bucket_masks, by_tests_scores

    z = (y - mean) / np.sqrt(var)
    nll = 0.5 * (np.log(2 * np.pi * var) + z**2)
    inside = np.abs(z) <= Z95
    out: dict[str, Any] = {"n": int(y.size)}
    for name, m in (("all", np.ones_like(urban)), ("urban", urban), ("rural", ~urban)):
        out[name] = {
            NLL: float(nll[m].mean()),
            COVERAGE95: float(inside[m].mean()),
            WIDTH95: float((2 * Z95 * np.sqrt(var[m])).mean()),
        }
    out["by_tests"] = by_tests_scores(y, mean, np.sqrt(var), urban, tests)
    # the mean error by tests bucket (observed - predicted, log10): a mean that ignores the
    # tests' shift leaves rows of few tests below it
    out["bias_by_tests"] = {
        bucket: float((y - mean)[m].mean()) for bucket, m in bucket_masks(tests).items() if m.any()
    }
    return out


def _map_scores(
    test: pd.DataFrame, mean: Any, var: Any, noise: Any, persistent: Any = None
) -> dict:
    """:func:`pipelines.map_calibration.map_calibration` of the test rows, with the same of
    the less measured test tiles under ``less_measured`` (as the report's
    ``tile_less_measured``)."""
    from pipelines.map_calibration import LESS_MEASURED_TESTS, MIN_TESTS, map_calibration

    rows = {
        "tiles": test["quadkey"].to_numpy(),
        "y": test["y"].to_numpy(),
        "tests": test["tests"].to_numpy(),
        "urban": test["urban"].to_numpy(bool),
        "mean": mean,
        "var": var,
        "noise": noise,
        "persistent": persistent,
        "places": test["place"].to_numpy(),
    }
    less = map_calibration(min_tests=LESS_MEASURED_TESTS, max_tests=MIN_TESTS, **rows)
    return {**map_calibration(**rows), "less_measured": less}


def _part_map(test: pd.DataFrame, gp_mean: np.ndarray, part: Any) -> dict:
    """:func:`_map_scores` of the tile quantity of a tile effect's or local layer's
    prediction ``part`` on the GP's mean."""
    return _map_scores(
        test, gp_mean + part.shift, part.tile_var, part.noise_var, part.persistent_var
    )


def coverage_interval_of(group: dict[str, Any]) -> list[float]:
    """A map group's ``coverage95_interval``; for files written before it, the same exact
    binomial interval from its ``tiles`` and ``coverage95``."""
    if COVERAGE95_INTERVAL in group:
        return list(group[COVERAGE95_INTERVAL])
    n = int(group["tiles"])
    return list(share_interval(round(group[COVERAGE95] * n), n))


def place_interval_of(group: dict[str, Any]) -> list[float]:
    """A map group's ``coverage95_interval_by_place``; its interval by tile
    (:func:`coverage_interval_of`) for files written before it or with fewer than two
    places."""
    interval = group.get(COVERAGE95_INTERVAL_BY_PLACE)
    return list(interval) if interval else coverage_interval_of(group)


def _shares_label(params: dict[str, Any]) -> str:
    """``0.05`` or, with group shares, ``0.05; urban 0.05, rural 1.25``."""
    text = f"{float(params.get('place_share', 1.0)):.2f}"
    own = params.get("place_share_by_group") or {}
    if own:
        text += "; " + ", ".join(f"{g} {float(c):.2f}" for g, c in sorted(own.items()))
    return text


def _less_measured_cell(m: dict[str, Any]) -> str:
    """``95.2 (166)``: a map's coverage of the less measured test tiles; ``–`` in files
    written before it or without such tiles."""
    less = (m.get("less_measured") or {}).get("all")
    return f"{100 * less[COVERAGE95]:.1f} ({less['tiles']})" if less else "–"


def table(folder: Path) -> str:
    """A markdown table of every ``*.json`` this script wrote in ``folder``: test NLL and 95%
    coverage of the rows, and coverage (with its 95% confidence interval over the tiles) /
    median |error| of well-measured tiles' levels; then, per model, the runs whose coverage
    interval holds 95% (all tiles, urban, rural), counted by tile and by place."""
    lines = [
        "| run | model | test NLL | row cov. | tests-bucket cells in 95 ± 2 | map tiles "
        "| map cov. (urban / rural) | its 95% CI | by place (places) | median \\|err\\| "
        "| off > 2x | 5–29 tests: cov. (tiles) |",
        "|---|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|",
    ]
    consistent: dict[str, dict[str, list[bool]]] = {}
    by_place: dict[str, dict[str, list[bool]]] = {}
    for path in sorted(folder.glob("*.json")):
        d = canonical_keys(json.loads(path.read_text()))
        share = _shares_label(d.get("local_layer") or {})
        prior = (d.get("local_layer") or {}).get("unseen_prior", "tile effect")
        prior = "GP" if prior == "gp" else "τ²"
        effect_share = _shares_label(d.get("tile_effect") or {})
        for key, res in d["results"].items():
            r, m = res["rows"]["all"], res["map"]
            name = {
                "local_layer": f"local_layer (c = {share}, {prior} prior)",
                "tile_effect": f"tile_effect (c = {effect_share})",
            }.get(key, key)
            name = {
                "local_layer_c1": "local_layer (c = 1)",
                "tile_effect_c1": "tile_effect (c = 1)",
            }.get(key, name)
            cov = " / ".join(
                f"{100 * m[g][COVERAGE95]:.1f}" if g in m else "–" for g in ("urban", "rural")
            )
            a = m.get("all", {})
            for g in ("all", "urban", "rural"):
                if g in m:
                    verdict = coverage_verdict(coverage_interval_of(m[g]))
                    consistent.setdefault(key, {}).setdefault(g, []).append(verdict == "consistent")
                    place_verdict = coverage_verdict(place_interval_of(m[g]))
                    by_place.setdefault(key, {}).setdefault(g, []).append(
                        place_verdict == "consistent"
                    )
            ci = place_ci = "–"
            if a:
                low, high = coverage_interval_of(a)
                ci = f"{100 * low:.1f}–{100 * high:.1f}"
                low, high = place_interval_of(a)
                place_ci = f"{100 * low:.1f}–{100 * high:.1f} ({a.get(PLACES, '?')})"
            cells = [
                b[g][COVERAGE95]
                for b in (res["rows"].get("by_tests") or {}).values()
                for g in ("urban", "rural")
                if isinstance(b.get(g), dict) and b[g].get("n", 0) >= 30
            ]
            inside = sum(0.93 <= c <= 0.97 for c in cells)
            lines.append(
                f"| {path.stem} | {name} | {r[NLL]:.3f} | {100 * r[COVERAGE95]:.1f} | "
                f"{inside}/{len(cells)} | "
                f"{m.get('tiles', 0)} | {100 * a.get(COVERAGE95, float('nan')):.1f} ({cov}) | "
                f"{ci} | {place_ci} | {a.get(MEDIAN_ABS_ERROR, float('nan')):.3f} | "
                f"{100 * a.get(OFF_BY_2X, float('nan')):.1f} | {_less_measured_cell(m)} |"
            )
    lines += [
        "",
        "| model | runs whose map coverage's 95% CI holds 95%, all / urban / rural: by tile "
        "| by place |",
        "|---|---|---|",
    ]

    def counts(groups: dict[str, list[bool]]) -> str:
        return " / ".join(
            f"{sum(groups.get(g, []))} of {len(groups.get(g, []))}"
            for g in ("all", "urban", "rural")
        )

    for key, groups in consistent.items():
        lines.append(f"| {key} | {counts(groups)} | {counts(by_place.get(key, {}))} |")
    return "\n".join(lines)


def neighbours_table(folder: Path) -> str:
    """A markdown table of the ``RUN.kK.json`` files of ``folder`` (``--neighbours K`` runs):
    per run and ``K``, the local layer's validation and test NLL (and the test NLL less that
    at the run's largest ``K``, the nearest to the dense field), its map coverage and median
    |error|, and the fitted range."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.k*.json")):
        run, _, k = path.stem.rpartition(".k")
        if k.isdigit():
            found.setdefault(run, {})[int(k)] = canonical_keys(json.loads(path.read_text()))
    lines = [
        "| run | k | validation NLL | test NLL | − at the largest k | map cov. | "
        "median \\|err\\| | range (km) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run, by_k in found.items():
        base = by_k[max(by_k)]
        for k, d in sorted(by_k.items()):
            res = d["results"]["local_layer"]
            nll = res["rows"]["all"][NLL]
            diff = f"{nll - base['results']['local_layer']['rows']['all'][NLL]:+.4f}"
            a = res["map"].get("all", {})
            lines.append(
                f"| {run} | {k} | {d['local_layer']['val_nll']:.4f} | {nll:.4f} | {diff} | "
                f"{100 * a.get(COVERAGE95, float('nan')):.1f} | "
                f"{a.get(MEDIAN_ABS_ERROR, float('nan')):.3f} | "
                f"{d['local_layer']['range_km']:.2f} |"
            )
    return "\n".join(lines)


def tile_spacing(run: Path, *, k: int = 8) -> str:
    """How close together the measured tiles of ``run``'s ``tiles.parquet`` lie (every split):
    their count and, for urban and rural tiles, the median distance (km, at the tiles' mean
    latitude) to the nearest other measured tile and to the ``k``-th nearest."""
    from scipy.spatial import cKDTree

    from geodbk.geo.quadkey import quadkey_centroid
    from geodbk.local_layer import lonlat_to_km

    urban = (
        pd.read_parquet(run / "tiles.parquet", columns=["quadkey", "urban"])
        .groupby("quadkey", observed=True)["urban"]
        .first()
    )
    lon, lat = quadkey_centroid(urban.index.astype(str).to_numpy())
    xy = lonlat_to_km(lon, lat, lat0=float(np.mean(lat)))
    d, _ = cKDTree(xy).query(xy, k=k + 1)
    lines = [f"{len(xy)} measured tiles"]
    for name, m in (("urban", urban.to_numpy(bool)), ("rural", ~urban.to_numpy(bool))):
        lines.append(
            f"{name}: {int(m.sum())} tiles, median km to the nearest {np.median(d[m, 1]):.2f}, "
            f"to the {k}th {np.median(d[m, k]):.2f}"
        )
    return "\n".join(lines)


def place_share_study(folder: Path) -> str:
    """Markdown of how the place share ``c`` moves the map coverage on every ``*.json`` of
    ``folder`` (block or tile splits, one target each): per run, the held-out units holding the
    well-measured validation tiles, the chosen ``c`` and its test-tile coverage with the 95%
    CI, and what the uncertified rule would choose (the smallest ``c`` whose validation
    coverage averaged over units reaches 0.95, without the ``(K + 1) / K``) and cover, and
    the one share for every tile the rule takes counting tiles and counting places; then,
    per target, the test-tile coverage pooled over the runs at the chosen ``c`` (all, urban and
    rural tiles), under the uncertified rule and at every ``c``."""
    from pipelines.layers import PLACE_COVERAGE

    lines = [
        "| run | GP best epoch | validation tiles (blocks) | chosen c: test cov. (95% CI) | uncertified rule: c → test cov. | one share counting tiles → places: c (places), test cov. |",
        "|---|---:|---:|---|---|---|",
    ]
    pooled: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        d = canonical_keys(json.loads(path.read_text()))
        layer = d["results"]["local_layer"]
        curve = layer["place_share_curve"]
        shares = sorted(float(c) for c in curve["test"])
        test = {float(c): v for c, v in curve["test"].items()}
        by_unit = {float(c): v for c, v in curve["validation_by_unit"].items()}
        uncertified = next((c for c in shares if by_unit[c] >= PLACE_COVERAGE - 1e-9), 1.0)
        by_tile_rule = _conformal_share(
            by_unit, curve["validation_tiles"], curve["validation_units"]
        )
        places = curve.get("validation_places")
        by_place_rule = (
            _conformal_share(
                {float(c): v for c, v in curve["validation_by_place"].items()},
                curve["validation_tiles"],
                places,
            )
            if places
            else None
        )
        place_cell = (
            f"{by_tile_rule:.2f} → {by_place_rule:.2f} ({places}), "
            f"{100 * test[by_tile_rule]:.1f} → {100 * test[by_place_rule]:.1f}"
            if by_place_rule is not None
            else "–"
        )
        chosen = _shares_label(d["local_layer"])
        whole = layer["map"]["all"]
        n = int(whole["tiles"])
        low, high = coverage_interval_of(whole)
        lines.append(
            f"| {path.stem} | {d['gp'].get('best_epoch')} | {curve['validation_tiles']} "
            f"({curve['validation_units']}) | {chosen}: {100 * whole[COVERAGE95]:.1f} "
            f"({100 * low:.1f}–{100 * high:.1f}) of {n} | {uncertified:.2f} → "
            f"{100 * test[uncertified]:.1f} | {place_cell} |"
        )
        target = pooled.setdefault(
            d["target"],
            {"n": 0, "chosen": 0, "rule": 0, "at": {}, "urban": [0, 0], "rural": [0, 0]},
        )
        target["n"] += n
        target["chosen"] += round(whole[COVERAGE95] * n)
        for group in ("urban", "rural"):
            part = layer["map"].get(group) or {}
            if part.get("tiles"):
                target[group][0] += int(part["tiles"])
                target[group][1] += round(part[COVERAGE95] * part["tiles"])
        target["rule"] += round(test[uncertified] * n)
        if by_place_rule is not None:
            target["by_tile"] = target.get("by_tile", 0) + round(test[by_tile_rule] * n)
            target["by_place"] = target.get("by_place", 0) + round(test[by_place_rule] * n)
            target["n_place"] = target.get("n_place", 0) + n
        for c in shares:
            target["at"][c] = target["at"].get(c, 0) + round(test[c] * n)
    for name, t in pooled.items():
        n = t["n"]
        every = ", ".join(f"{c:.2f}: {100 * k / n:.1f}" for c, k in sorted(t["at"].items())[::2])
        groups = ", ".join(
            f"{g} {100 * t[g][1] / t[g][0]:.1f}% of {t[g][0]}"
            for g in ("urban", "rural")
            if t[g][0]
        )
        lines.append(
            f"\n{name}, pooled over {n} test tiles: chosen {100 * t['chosen'] / n:.1f}% "
            f"({groups}), uncertified rule {100 * t['rule'] / n:.1f}%; at each c: {every}"
        )
        if t.get("n_place"):
            m = t["n_place"]
            lines.append(
                f"one share counting tiles: {100 * t['by_tile'] / m:.1f}%, counting places: "
                f"{100 * t['by_place'] / m:.1f}% of {m} test tiles"
            )
    return "\n".join(lines)


def _conformal_share(unit_coverage: dict[float, float], tiles: int, units: int) -> float:
    """The pooled place share :func:`pipelines.layers.choose_place_share` takes from a
    validation curve (coverage averaged over ``units`` held-out units of ``tiles`` tiles):
    1 when they cannot certify one, else the smallest share reaching the conformal count,
    else the widest."""
    from pipelines.layers import PLACE_SHARES, certifies, first_covering_share

    if not certifies(tiles, units):
        return 1.0
    share = first_covering_share(lambda c: unit_coverage[float(c)], units=units)
    return float(PLACE_SHARES[-1]) if share is None else float(share)


def spread_table(folder: Path) -> str:
    """Markdown of every ``*.json`` of ``folder`` with a ``neighbour_spread_study``: per run,
    the unmeasured test tiles, the Spearman correlation of their neighbours' spread with their
    squared standardised error, and each third of the spread's coverage and mean ``z²``."""
    lines = [
        "| run | tiles | Spearman | low third: cov., mean z² | middle | high |",
        "|---|---:|---:|---|---|---|",
    ]
    for path in sorted(folder.glob("*.json")):
        study = json.loads(path.read_text())["results"]["local_layer"].get("neighbour_spread_study")
        if not study:
            continue
        thirds = " | ".join(
            f"{100 * t['coverage']:.1f}, {t['mean_z2']:.2f}" for t in study["thirds"]
        )
        lines.append(f"| {path.stem} | {study['tiles']} | {study['spearman']:+.2f} | {thirds} |")
    return "\n".join(lines)


def summary(folder: Path) -> str:
    """One markdown row per run of ``folder``'s ``RUN.json`` (with the tile effect's tests
    shift) and ``RUN.no_shift.json`` (without it, on the same GP): the GP's best and last
    epoch (from ``history_RUN.csv`` when present), test NLL of the GP, tile effect, local
    layer and kriging, the local layer's NLL less the GP's, its map coverage with the 95%
    confidence interval, and the median |error| of well-measured tiles' levels, f then tile."""
    lines = [
        "| run | GP epochs (best / run) | GP | tile effect | local layer | kriging "
        "| local layer − GP (without the shift) | local layer's map cov. (urban / rural), its "
        "95% CI (without the shift) | median \\|err\\|: f → tile |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".no_shift.json"):
            continue
        d = canonical_keys(json.loads(path.read_text()))
        without_path = path.with_name(f"{path.stem}.no_shift.json")
        without = (
            canonical_keys(json.loads(without_path.read_text())) if without_path.exists() else None
        )
        res = d["results"]
        nll = {key: res[key]["rows"]["all"][NLL] for key in res}
        history = folder / f"history_{path.stem}.csv"
        last = str(len(pd.read_csv(history))) if history.exists() else "?"
        gain = f"{nll['local_layer'] - nll['gp']:+.3f}".replace("-", "−")
        cov_without = "–"
        if without is not None:
            w = without["results"]
            gain += f" ({w['local_layer']['rows']['all'][NLL] - w['gp']['rows']['all'][NLL]:+.3f})".replace(
                "-", "−"
            )
            cov_without = f"{100 * w['local_layer']['map']['all'][COVERAGE95]:.1f}"
        m = res["local_layer"]["map"]
        low, high = coverage_interval_of(m["all"])
        groups = " / ".join(
            f"{100 * m[g][COVERAGE95]:.1f}" if g in m else "–" for g in ("urban", "rural")
        )
        kriging = f"{nll['kriging']:.3f}" if "kriging" in nll else "–"
        lines.append(
            f"| {path.stem} | {d['gp']['best_epoch']} / {last} | {nll['gp']:.3f} | "
            f"{nll['tile_effect']:.3f} | **{nll['local_layer']:.3f}** | {kriging} | {gain} | "
            f"{100 * m['all'][COVERAGE95]:.1f} ({groups}), {100 * low:.1f}–{100 * high:.1f} "
            f"({cov_without}) | {res['gp']['map']['all'][MEDIAN_ABS_ERROR]:.3f} → "
            f"{m['all'][MEDIAN_ABS_ERROR]:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; see the module docstring."""
    import torch

    from geodbk import DBKRegressor
    from geodbk.local_layer import NEIGHBOURS
    from geodbk.tile_effect import urban_groups
    from pipelines.layers import (
        PLACE_SHARES,
        fit_run_local_layer,
        tile_positions,
        validation_share_coverage,
        validation_tile_levels_at,
        with_effect_place_share,
    )

    if argv is None:
        import sys

        argv = sys.argv[1:]
    reports = {
        "--table": table,
        "--summary": summary,
        "--neighbours-table": neighbours_table,
        "--spacing": tile_spacing,
        "--place-shares": place_share_study,
        "--spread-table": spread_table,
    }
    if argv[:1] and argv[0] in reports:
        print(reports[argv[0]](Path(argv[1])))
        return 0
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-kriging", action="store_true")
    p.add_argument(
        "--neighbours",
        type=int,
        default=NEIGHBOURS,
        help="measured tiles that krige the field at a place (default: %(default)s)",
    )
    p.add_argument(
        "--no-tests-mean",
        action="store_true",
        help="fit the tile effect without the rows' tests shift (the model before it)",
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
    tiles = frame["quadkey"].astype(str).to_numpy()
    tr, va, te = (split == s for s in ("train", "val", "test"))

    y_all = frame["y"].to_numpy()
    effect = fit_run_tile_effect(
        model, frame, gp, seed=args.seed, tests_mean=not args.no_tests_mean
    )
    t_effect = time.perf_counter()
    val = validation_rows(args.run, frame, gp)
    layer = fit_run_local_layer(
        model, effect, n_train=int(tr.sum()), val=val, neighbours=args.neighbours
    )
    val_rows = {
        "residual": y_all[va] - gp["mean"][va],
        "urban": urban[va],
        "tiles": tiles[va],
        "times": gp["times"][va],
        "var_f": gp["var_f"][va],
        "components": gp["comp"][va],
        "groups": groups[va],
    }
    t_layer = time.perf_counter()
    xy = tile_positions(tiles, lat0=layer.params.lat0, lon0=layer.params.lon0)
    y = y_all[te]
    u = urban[te]
    tests = frame["tests"].to_numpy(np.float64)[te]
    comp = gp["comp"][te]
    results: dict[str, Any] = {}
    # the GP alone: row = observation; map = area quantity (f, var_f)
    results["gp"] = {
        "rows": _scores(y, gp["mean"][te], gp["var_f"][te] + comp.sum(1), u, tests),
        "map": _map_scores(frame[te], gp["mean"][te], gp["var_f"][te], comp.sum(1)),
    }
    kw = {
        "tiles": tiles[te],
        "times": gp["times"][te],
        "var_f": gp["var_f"][te],
        "components": comp,
        "groups": groups[te],
    }
    # the tile effect alone, as `geodbk train --no-local-layer` saves it: with its own place
    # share chosen on the validation tiles (the layer keeps its own)
    effect = with_effect_place_share(model, effect, n_train=int(tr.sum()), val=val)
    # maps are scored as the report scores them: an unmeasured tile stated as the map draws
    # it, at a typical training row's tests (rows: at their own)
    centre = effect.params.tests_centre
    part = effect.predict(**kw)
    whole_effect = effect.predict(**kw, place_share=1.0, tile_components=centre)
    results["tile_effect"] = {
        "rows": _scores(
            y, gp["mean"][te] + part.observation_shift, part.tile_var + part.noise_var, u, tests
        ),
        "map": _part_map(frame[te], gp["mean"][te], effect.predict(**kw, tile_components=centre)),
        "test_rows_with_history": float(part.seen.mean()),
    }
    results["tile_effect_c1"] = {
        "rows": results["tile_effect"]["rows"],
        "map": _part_map(frame[te], gp["mean"][te], whole_effect),
    }
    lpart = layer.predict(xy=xy[te], **kw)
    pull = lpart.pull if lpart.pull is not None else np.zeros(len(y))
    results["local_layer"] = {
        "rows": _scores(
            y,
            gp["mean"][te] + lpart.observation_shift,
            lpart.tile_var + lpart.noise_var,
            u,
            tests,
        ),
        "map": _part_map(
            frame[te],
            gp["mean"][te],
            layer.predict(xy=xy[te], tile_components=centre, **kw),
        ),
        # each unmeasured tile at its own rows' tests, as the report scored it before
        "map_own_testers": _part_map(frame[te], gp["mean"][te], lpart),
        "mean_abs_pull": float(np.abs(pull).mean()),
    }
    # the same layer with the whole prior kept as the place's (c = 1): the same rows
    whole = layer_at_share(layer, 1.0).predict(xy=xy[te], tile_components=centre, **kw)
    results["local_layer_c1"] = {
        "rows": results["local_layer"]["rows"],
        "map": _part_map(frame[te], gp["mean"][te], whole),
    }
    # test rows of unmeasured tiles whose prior is below lambda v_f: no offset for the place
    # share to scale (split_unseen_prior keeps their prior at every share)
    unseen_rows = ~np.asarray(whole.seen)
    below = unseen_rows & (whole.tile_var < layer.unseen_latent_scale * gp["var_f"][te])
    results["local_layer"]["unseen_rows_prior_below_latent"] = (
        float(below.sum() / unseen_rows.sum()) if unseen_rows.any() else None
    )
    results["local_layer"]["unseen_prior_study"] = _unseen_prior_study(
        layer,
        n_train=int(tr.sum()),
        val_rows=val_rows,
        test=frame[te],
        gp_mean=gp["mean"][te],
        xy=xy,
        va=va,
        te=te,
        kw=kw,
    )
    results["local_layer"]["neighbour_spread_study"] = _neighbour_spread_study(
        layer, test=frame[te], gp_mean=gp["mean"][te], xy_test=xy[te], chosen=lpart
    )
    # the place share's choice: coverage of well-measured tiles' levels at every share, on
    # the validation tiles without training rows (as chosen) and on the test tiles
    val_curve = validation_share_coverage(model, layer, n_train=int(tr.sum()), val=val)
    # the same tiles counted by place (zoom-12 parents; a block split's places are its
    # blocks, the units already counted): what a rule counting places would choose
    by_place = validation_share_coverage(
        model, layer, n_train=int(tr.sum()), val=val, counted_by=frame["place"].to_numpy()[va]
    )
    # the same with every unmeasured tile at its own rows' tests, on both sides
    own_curve = validation_share_coverage(
        model, layer, n_train=int(tr.sum()), val=val, own_testers=True
    )
    test_own = {}
    test_curve = {}
    for c in PLACE_SHARES:
        at_c = layer_at_share(layer, c)
        for curve, at in ((test_curve, centre), (test_own, None)):
            curve[float(c)] = (
                _part_map(
                    frame[te], gp["mean"][te], at_c.predict(xy=xy[te], tile_components=at, **kw)
                )
                .get("all", {})
                .get(COVERAGE95)
            )
    results["local_layer"]["place_share_curve"] = {
        "validation_tiles": val_curve["tiles"],
        "validation_units": val_curve["units"],
        "validation": val_curve["coverage"],
        "validation_by_unit": val_curve["unit_coverage"],
        "validation_places": by_place["units"],
        "validation_by_place": by_place["unit_coverage"],
        "test": test_curve,
        "validation_by_unit_own_testers": own_curve["unit_coverage"],
        "test_own_testers": test_own,
    }
    # how wide the validation tiles' intervals are, and those a share leaves uncovered
    if val_curve["tiles"]:
        spread = {}
        levels_at = validation_tile_levels_at(model, layer, n_train=int(tr.sum()), val=val)
        for c in (1.0, float(PLACE_SHARES[-1])):
            levels = levels_at(c)
            z = (levels["error"] / levels["sd"]).abs()
            missed = levels[z > Z95]
            spread[str(c)] = {
                "median_sd": float(levels["sd"].median()),
                "missed": [
                    {"error": float(e), "sd": float(d), "urban": bool(u)}
                    for e, d, u in zip(missed["error"], missed["sd"], missed["urban"], strict=True)
                ],
            }
        results["local_layer"]["validation_spread"] = spread
    t_krige = None
    if not args.no_kriging:
        t1 = time.perf_counter()
        results["kriging"] = _kriging(frame, gp, xy, tr | va, te, seed=args.seed)
        t_krige = time.perf_counter() - t1
    md = model.metadata_
    out = {
        "run": str(args.run),
        "target": args.target,
        "time_aware": bool(md.get("time_scaling")),
        "split": (json.loads((args.run / "ingest_report.json").read_text()).get("split") or {}),
        "rows": {"train": int(tr.sum()), "val": int(va.sum()), "test": int(te.sum())},
        "gp": {k: md["config"][k] for k in ("rank", "hidden", "epochs", "noise")}
        | {"best_epoch": md.get("best_epoch")},
        "tile_effect": effect.params.to_dict(),
        "local_layer": layer.params.to_dict(),
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
            f"{name:12s} NLL {r[NLL]:.3f} cov {r[COVERAGE95]:.3f} | map cov "
            f"{m.get(COVERAGE95, float('nan')):.3f} med|err| "
            f"{m.get(MEDIAN_ABS_ERROR, float('nan')):.3f} >2x {m.get(OFF_BY_2X, float('nan')):.3f}"
        )
    return 0


def _unseen_prior_study(
    layer: Any,
    *,
    n_train: int,
    val_rows: dict[str, Any],
    test: pd.DataFrame,
    gp_mean: np.ndarray,
    xy: np.ndarray,
    va: np.ndarray,
    te: np.ndarray,
    kw: dict[str, Any],
) -> dict[str, Any]:
    """The layer's fitted field under each prior of an unmeasured tile (the tile effect's
    ``tau²`` and the GP's): the validation NLL of the validation rows without training history
    (urban, rural, all; the layer conditioned on the training rows, as the choice is made) and
    the test map at the chosen place shares (``chosen``: the pooled one and each group's own)
    and at 1 (``1.0``), plus the test tiles the chosen layer's
    interval misses (tile, urban, error, sd). The field is not refitted per prior, so the NLLs
    differ a little from ``val_nll_unseen``."""
    from geodbk.local_layer import LocalLayer
    from geodbk.metrics import gaussian_nll
    from geodbk.tile_effect import UNSEEN_EFFECT
    from pipelines.layers import _effect_positions

    lat0, lon0 = layer.params.lat0, layer.params.lon0
    train_effect = layer.effect.first_rows(n_train)
    train_xy = _effect_positions(train_effect, lat0, lon0)
    rows = {k: val_rows[k] for k in ("tiles", "times", "var_f", "components", "groups")}
    out: dict[str, Any] = {"chosen": layer.params.unseen_prior}
    for prior in (UNSEEN_EFFECT, UNSEEN_GP):
        params = replace(
            layer.params, unseen_prior=prior, place_share=1.0, place_share_by_group=None
        )
        on_train = LocalLayer(train_effect, params, tile_xy=train_xy, positions=layer.positions)
        pv = on_train.predict(xy=xy[va], **rows)
        unseen = ~np.asarray(pv.seen)
        nll = {}
        for name, m in (
            ("urban", unseen & val_rows["urban"]),
            ("rural", unseen & ~val_rows["urban"]),
            ("all", unseen),
        ):
            nll[name] = (
                float(
                    gaussian_nll(
                        val_rows["residual"][m],
                        pv.observation_shift[m],
                        (pv.tile_var + pv.noise_var)[m],
                    )
                )
                if m.any()
                else None
            )
        shares = {
            "1.0": (1.0, None),  # the whole prior
            "chosen": (layer.params.place_share, layer.params.place_share_by_group),
        }
        maps = {}
        for key, (c, by_group) in shares.items():
            at_c = LocalLayer(
                layer.effect,
                replace(params, place_share=c, place_share_by_group=by_group),
                tile_xy=layer.tile_xy,
                positions=layer.positions,
            ).predict(xy=xy[te], **kw)
            maps[key] = _part_map(test, gp_mean, at_c)
        out[prior] = {"validation_unseen_nll": nll, "map": maps}
    chosen = layer.predict(xy=xy[te], **kw)
    levels = _tile_levels(test, gp_mean, chosen)
    missed = levels[levels["error"].abs() > Z95 * levels["sd"]]
    out["missed_tiles"] = [
        {"tile": str(r.tile), "urban": bool(r.urban), "error": float(r.error), "sd": float(r.sd)}
        for r in missed.itertuples()
    ]
    return out


def _tile_levels(test: pd.DataFrame, gp_mean: np.ndarray, part: Any) -> pd.DataFrame:
    """:func:`pipelines.map_calibration.tile_level_errors` of the tile quantity of a tile
    model's prediction ``part`` at the test rows, on the GP's mean."""
    from pipelines.map_calibration import tile_level_errors

    return tile_level_errors(
        tiles=test["quadkey"].to_numpy(),
        y=test["y"].to_numpy(),
        tests=test["tests"].to_numpy(),
        urban=test["urban"].to_numpy(bool),
        mean=gp_mean + part.shift,
        var=part.tile_var,
        noise=part.noise_var,
        persistent=part.persistent_var,
    )


def _neighbour_spread_study(
    layer: Any, *, test: pd.DataFrame, gp_mean: np.ndarray, xy_test: np.ndarray, chosen: Any
) -> dict[str, Any] | None:
    """Would a prior scaled by the place's local spread help? For each well-measured test tile
    without conditioning rows: ``S``, the mean over its ``k`` nearest measured tiles of the
    squared standardised level ``b_j² / (sigma² + lambda v_j + w_j)`` (each measured tile's GLS
    level and the variance the layer gives it, :func:`geodbk.local_layer._summaries`; 1 on
    average under the model), against ``z²``, the tile's squared standardised error of the
    tile quantity (``chosen``: the layer's prediction at the test rows). A locally scaled
    prior pays only where the two rise together: their Spearman correlation, and the coverage
    and mean ``z²`` of the tiles in each third of ``S``. ``None`` without such tiles (a random
    split)."""
    from scipy.stats import spearmanr

    from geodbk.local_layer import _summaries

    levels = _tile_levels(test, gp_mean, chosen)
    tiles = test["quadkey"].astype(str).to_numpy()
    _, first = np.unique(tiles, return_index=True)  # sorted, as tile_level_errors' tiles
    at = np.searchsorted(tiles[first], levels["tile"].to_numpy())
    rows = first[at]
    unseen = ~np.asarray(chosen.seen)[rows]
    if unseen.sum() < 9:
        return None
    t = layer._tensors()
    s = _summaries(layer.effect._layout(), t.tau2, t.rho, t.kappa, t.mu)
    z2_nb = (s.b**2 / (t.sigma2 + t.lam * s.v + s.w)).numpy()
    k = layer.params.neighbours
    _, nb = layer._neighbours.tree.query(xy_test[rows[unseen]], k=k)
    spread = z2_nb[nb.reshape(-1, k)].mean(axis=1)
    z2 = (levels["error"] / levels["sd"]).to_numpy()[unseen] ** 2
    edges = np.quantile(spread, [1 / 3, 2 / 3])
    third = np.searchsorted(edges, spread, side="left")
    return {
        "tiles": int(unseen.sum()),
        "neighbours": k,
        "spearman": float(spearmanr(spread, z2).statistic),
        "thirds": [
            {
                "tiles": int((third == i).sum()),
                "median_spread": float(np.median(spread[third == i])),
                "coverage": float(np.mean(z2[third == i] <= Z95**2)),
                "mean_z2": float(np.mean(z2[third == i])),
            }
            for i in range(3)
        ],
    }


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
        "rows": _scores(y, mean, ss + row_noise, u, frame["tests"].to_numpy(np.float64)[test]),
        "map": _map_scores(frame[test], mean, ss, row_noise),
    }


if __name__ == "__main__":
    raise SystemExit(main())
