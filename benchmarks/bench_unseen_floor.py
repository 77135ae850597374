"""Should an unmeasured tile's variance floor be the GP's ``v_f`` or ``lambda v_f``?

Below a place share of 1, :func:`geodbk.tile_effect.split_unseen_prior` keeps an unmeasured
tile's variance at least ``v_f``, its area quantity's. The alternative measured here lowers
that floor to the tile effect's ``lambda v_f`` (``lambda`` is 1 under the GP's prior of an
unmeasured tile, so only runs whose unmeasured tiles take the tile effect's prior differ). For
each floor the tile effect and local layer are fitted as ``geodbk train`` fits them (the place
share chosen under that floor; :func:`pipelines.layers.fit_run_local_layer`), then the test
map is scored as the report scores it (:mod:`pipelines.map_calibration`, an unmeasured tile at
a typical training row's tests):

- ``busy``: test tiles with 30+ tests, the report's map calibration;
- ``quiet``: test tiles with 5–29 tests, whose level carries more of its own noise (counted
  in each tile's score) and which are more like the map's typical tile;
- ``validation_at_floor``: the validation tiles the share is chosen on (30+ tests, no
  training rows) covered at a share of 0, by the floor alone
  (:func:`pipelines.layers.validation_tile_levels`).

Needs a run with a trained GP (``geodbk train``); one JSON line per run::

    OMP_NUM_THREADS=1 python benchmarks/bench_unseen_floor.py --run runs/ll/t0-download \\
        --target download --out OUT/t0-download.json
    python benchmarks/bench_unseen_floor.py --table OUT

(docs/decisions/local_layer.md, "Decision: an unmeasured tile keeps the GP's v_f as its floor").
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
from bench_local_layer import _gp_parts, _rows, fit_run_tile_effect

import geodbk.local_layer as local_layer
import geodbk.tile_effect as tile_effect
import pipelines.layers as layers
from geodbk.geo.blocks import held_out_units
from geodbk.geo.contract import Z95
from geodbk.geo.table import read_table_metadata
from geodbk.tile_effect import TileEffectPrediction, urban_groups
from pipelines.layers import (
    ValidationRows,
    fit_run_local_layer,
    tile_positions,
    validation_tile_levels,
)
from pipelines.map_calibration import MIN_TESTS, tile_level_errors

FLOORS = ("v_f", "lambda v_f")
QUIET_TESTS = 5


def split_with_latent_floor(
    pred: TileEffectPrediction,
    *,
    var_f: np.ndarray,
    latent_scale: float,
    place_share: float | np.ndarray,
) -> TileEffectPrediction:
    """:func:`geodbk.tile_effect.split_unseen_prior` with the floor of an unmeasured tile at
    ``min(lambda v_f, tile_var)`` instead of ``min(v_f, tile_var)``: ``tile_var' =
    clip(min(lambda v_f, tile_var) + c P, min(lambda v_f, tile_var), tile_var + noise_var -
    persistent_var)``, one test's variance kept."""
    if np.all(np.asarray(place_share) == 1.0):
        return pred
    whole = pred.tile_var
    latent = np.minimum(latent_scale * np.asarray(var_f, dtype=np.float64), whole)
    kept = latent + place_share * np.maximum(whole - latent, 0.0)
    widest = whole + np.maximum(pred.noise_var - pred.persistent_var, 0.0)
    tile_var = np.where(pred.seen, whole, np.clip(kept, latent, widest))
    return replace(pred, tile_var=tile_var, noise_var=pred.noise_var + (whole - tile_var))


@contextlib.contextmanager
def floor_of(name: str) -> Iterator[None]:
    """Within the block, unmeasured tiles' floor is ``name`` (one of :data:`FLOORS`): in the
    maps and in the place share's choice, every module that splits the prior."""
    if name == FLOORS[0]:
        yield
        return
    with contextlib.ExitStack() as stack:
        for module in (tile_effect, local_layer, layers):
            stack.enter_context(
                mock.patch.object(module, "split_unseen_prior", split_with_latent_floor)
            )
        yield


def _coverage(levels: pd.DataFrame) -> dict[str, Any]:
    """Tiles and 95% coverage of scored tile levels, all, urban and rural."""
    covered = levels["error"].abs() <= Z95 * levels["sd"]
    urban = levels["urban"].to_numpy(bool)
    out: dict[str, Any] = {}
    for group, keep in (("all", slice(None)), ("urban", urban), ("rural", ~urban)):
        c = covered[keep]
        out[group] = {"tiles": int(c.size), "coverage95": float(c.mean()) if c.size else None}
    return out


def measure(run: Path, target: str) -> dict[str, Any]:
    """Each floor's chosen place shares and test-map coverage (busy and quiet tiles)."""
    import torch

    from geodbk import DBKRegressor

    torch.set_num_threads(1)
    model = DBKRegressor.load(run / "models" / target, device="cpu")
    frame = _rows(run, target)
    gp = _gp_parts(model, frame)
    split = frame["split"].to_numpy()
    urban = frame["urban"].to_numpy(bool)
    groups = urban_groups(urban)
    tiles = frame["quadkey"].astype(str).to_numpy()
    tr, va, te = (split == s for s in ("train", "val", "test"))
    y = frame["y"].to_numpy()
    effect = fit_run_tile_effect(model, frame, gp)
    val = ValidationRows(
        X=gp["X"][va],
        y=y[va],
        tiles=tiles[va],
        times=gp["times"][va],
        noise={k: np.asarray(v)[va] for k, v in gp["noise"].items()},
        groups=groups[va],
        tests=frame["tests"].to_numpy(np.float64)[va],
        urban=urban[va],
        units=held_out_units(
            frame["lon"].to_numpy()[va],
            frame["lat"].to_numpy()[va],
            read_table_metadata(run / "tiles.parquet").get("split"),
        ),
    )
    test = frame[te]
    rows = {
        "tiles": tiles[te],
        "times": gp["times"][te],
        "var_f": gp["var_f"][te],
        "components": gp["comp"][te],
        "groups": groups[te],
    }
    tile_tests = test.groupby("quadkey")["tests"].sum()
    result: dict[str, Any] = {"run": str(run), "target": target}
    for name in FLOORS:
        with floor_of(name):
            layer = fit_run_local_layer(model, effect, n_train=int(tr.sum()), val=val)
            xy = tile_positions(tiles[te], lat0=layer.params.lat0, lon0=layer.params.lon0)
            part = layer.predict(xy=xy, tile_components=layer.effect.params.tests_centre, **rows)
            at_floor = validation_tile_levels(
                model, layer, n_train=int(tr.sum()), val=val, place_share=0.0
            )
        levels = tile_level_errors(
            tiles=test["quadkey"].to_numpy(),
            y=test["y"].to_numpy(),
            tests=test["tests"].to_numpy(),
            urban=test["urban"].to_numpy(bool),
            mean=gp["mean"][te] + part.shift,
            var=part.tile_var,
            noise=part.noise_var,
            persistent=part.persistent_var,
            min_tests=QUIET_TESTS,
        )
        busy = tile_tests.reindex(levels["tile"].to_numpy()).to_numpy() >= MIN_TESTS
        result[name] = {
            "place_share": layer.params.place_share,
            "place_share_by_group": layer.params.place_share_by_group,
            "latent_scale": layer.unseen_latent_scale,
            "busy": _coverage(levels[busy]),
            "quiet": _coverage(levels[~busy]),
            "validation_at_floor": _coverage(at_floor),
        }
    return result


def table(folder: Path) -> str:
    """Per run and floor: the shares and the coverage of busy and quiet test tiles; then the
    tiles pooled per floor."""
    lines = [
        "| run | floor | shares | validation at the floor: all / urban / rural "
        "| busy: all / urban / rural | quiet: all / urban / rural |",
        "|---|---|---|---|---|---|",
    ]
    pooled: dict[tuple[str, str, str], list[float]] = {}
    for path in sorted(folder.glob("*.json")):
        res = json.loads(path.read_text())
        for name in FLOORS:
            r = res[name]
            cells = []
            for kind in ("validation_at_floor", "busy", "quiet"):
                parts = []
                for group in ("all", "urban", "rural"):
                    g = r[kind][group]
                    parts.append("–" if g["coverage95"] is None else f"{100 * g['coverage95']:.1f}")
                    acc = pooled.setdefault((name, kind, group), [0.0, 0.0])
                    acc[0] += g["tiles"]
                    acc[1] += (g["coverage95"] or 0.0) * g["tiles"]
                cells.append(" / ".join(parts))
            shares = f"{r['place_share']:.2f} {r['place_share_by_group'] or ''}"
            lines.append(f"| {path.stem} | {name} | {shares} | {' | '.join(cells)} |")
    lines.append("")
    for (name, kind, group), (n, hit) in pooled.items():
        if n:
            lines.append(f"- {name}, {kind} {group}: {100 * hit / n:.1f}% of {int(n)} tiles")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure one run, or print the table of a folder of results; see the docstring."""
    if argv is None:
        import sys

        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        print(table(Path(argv[1])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = measure(args.run, args.target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
