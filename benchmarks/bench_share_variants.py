"""The place share against three alternatives: an unmeasured tile's variance floor at
``lambda v_f`` instead of the GP's ``v_f``, the share chosen on validation tiles with 5+ tests
instead of 30+, and other rules than the conformal count.

Below a place share of 1, :func:`geodbk.tile_effect.split_unseen_prior` keeps an unmeasured
tile's variance at least ``v_f``, its area quantity's, and the share is chosen on validation
tiles with 30+ tests (:func:`pipelines.layers.choose_place_share`). Two alternatives are
measured against that (:func:`variants`):

- ``lambda v_f``: the floor lowered to the tile effect's ``lambda v_f`` (``lambda`` is 1 under
  the GP's prior of an unmeasured tile, so only runs whose unmeasured tiles take the tile
  effect's prior differ);
- ``chosen on 5+``: the share chosen on validation tiles with 5+ tests, each scored with its
  level's own noise, more of them and more like the map's typical tile.

Beside them, ``rules``: with the design as it is, each urban / rural group's share chosen
from the same validation tiles by another rule than the conformal count, and the test map's
coverage of that group's well-measured tiles at it (every share of
:data:`pipelines.layers.PLACE_SHARES` tried): ``nll``, the share of the lowest Gaussian NLL of
the tiles' level errors; ``median``, the share whose median ``|error| / sd`` is nearest 0.674
(a Gaussian's); ``conformal``, the share chosen.

For each variant the tile effect and local layer are fitted as ``geodbk train`` fits them (the
place share chosen under the variant; :func:`pipelines.layers.fit_run_local_layer`), then the
test map is scored as the report scores it (:mod:`pipelines.map_calibration`, an unmeasured
tile at a typical training row's tests):

- ``busy``: test tiles with 30+ tests, the report's map calibration;
- ``quiet``: test tiles with 5–29 tests, whose level carries more of its own noise (counted
  in each tile's score) and which are more like the map's typical tile;
- ``validation_at_floor``: the validation tiles the share is chosen on (no training rows;
  30+ tests, 5+ for ``chosen on 5+``) covered at a share of 0, by the floor alone
  (:func:`pipelines.layers.validation_tile_levels`).

Needs a run with a trained GP (``geodbk train``); one JSON line per run::

    OMP_NUM_THREADS=1 python benchmarks/bench_share_variants.py --run runs/ll/t0-download \\
        --target download --out OUT/t0-download.json
    python benchmarks/bench_share_variants.py --table OUT

(docs/decisions/local_layer.md, "Decision: the place share stays as it is"). Under
``--table`` the variants' pooled coverage and the runs' spread about 95%, and each rule's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
from bench_local_layer import (
    _gp_parts,
    _rows,
    fit_run_tile_effect,
    layer_at_share,
    validation_rows,
)

import geodbk.local_layer as local_layer
import geodbk.tile_effect as tile_effect
import pipelines.layers as layers
from geodbk.geo.contract import Z95
from geodbk.local_layer import LocalLayer
from geodbk.tile_effect import TileEffectPrediction, urban_groups
from pipelines.layers import (
    PLACE_SHARES,
    fit_run_local_layer,
    tile_positions,
    validation_tile_levels_at,
)
from pipelines.map_calibration import MIN_TESTS, tile_level_errors

#: Tests of the less well measured test tiles scored beside the report's (30+).
QUIET_TESTS = 5
#: Tests from which the ``chosen on`` variant scores validation tiles to choose the share
#: (``--choosing-tests``).
CHOOSING_TESTS = 5


def variants(choosing_tests: int = CHOOSING_TESTS) -> tuple[str, ...]:
    """The design as it is, then the alternatives (module docstring)."""
    return ("v_f", "lambda v_f", f"chosen on {choosing_tests}+")


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
def variant(name: str) -> Iterator[None]:
    """Within the block, fit and predict as ``name`` (one of :func:`variants`) says: the
    lower floor in the maps and in the place share's choice (every module that splits the
    prior), or the share's validation tiles scored from the tests the name gives
    (``chosen on 5+``)."""
    with contextlib.ExitStack() as stack:
        if name == "lambda v_f":
            for module in (tile_effect, local_layer, layers):
                stack.enter_context(
                    mock.patch.object(module, "split_unseen_prior", split_with_latent_floor)
                )
        elif name.startswith("chosen on"):
            tests = int(name.removeprefix("chosen on ").rstrip("+"))
            scored_from = functools.partial(tile_level_errors, min_tests=tests)
            stack.enter_context(mock.patch.object(layers, "tile_level_errors", scored_from))
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


def _rules(
    layer: LocalLayer,
    validation_at: Any,
    test_at: Any,
) -> dict[str, dict[str, Any]]:
    """Per urban / rural group: the share each rule of the module docstring picks from the
    validation tiles' levels (``validation_at(c)``) and the test tiles' coverage at it
    (``test_at(c)``, well-measured tiles)."""
    val = {c: validation_at(c) for c in PLACE_SHARES}
    test = {c: test_at(c) for c in PLACE_SHARES}
    by_group = layer.params.place_share_by_group or {}
    out: dict[str, dict[str, Any]] = {}
    for group, flag in (("urban", True), ("rural", False)):
        v = {c: d[d["urban"].to_numpy(bool) == flag] for c, d in val.items()}
        t = {c: d[d["urban"].to_numpy(bool) == flag] for c, d in test.items()}
        if not len(v[1.0]) or not len(t[1.0]):
            continue
        nll = {
            c: float(np.mean(np.log(d["sd"] ** 2) + (d["error"] / d["sd"]) ** 2))
            for c, d in v.items()
        }
        median = {c: float(np.median(np.abs(d["error"] / d["sd"]))) for c, d in v.items()}
        picks = {
            "conformal": float(by_group.get(group, layer.params.place_share)),
            "nll": min(nll, key=nll.__getitem__),
            "median": min(median, key=lambda c: abs(median[c] - 0.6745)),
        }
        out[group] = {
            "validation_tiles": len(v[1.0]),
            "test_tiles": len(t[1.0]),
            **{
                rule: {
                    "share": c,
                    "coverage95": float((t[c]["error"].abs() <= Z95 * t[c]["sd"]).mean()),
                }
                for rule, c in picks.items()
            },
        }
    return out


def measure(run: Path, target: str, *, choosing_tests: int = CHOOSING_TESTS) -> dict[str, Any]:
    """Each variant's chosen place shares and test-map coverage (busy and quiet tiles)."""
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
    tr, te = split == "train", split == "test"
    effect = fit_run_tile_effect(model, frame, gp)
    val = validation_rows(run, frame, gp)
    test = frame[te]
    rows = {
        "tiles": tiles[te],
        "times": gp["times"][te],
        "var_f": gp["var_f"][te],
        "components": gp["comp"][te],
        "groups": groups[te],
    }
    tile_tests = test.groupby("quadkey")["tests"].sum()

    def test_levels(tile_model: LocalLayer, xy: np.ndarray, *, min_tests: int = MIN_TESTS) -> Any:
        part = tile_model.predict(
            xy=xy, tile_components=tile_model.effect.params.tests_centre, **rows
        )
        return tile_level_errors(
            tiles=test["quadkey"].to_numpy(),
            y=test["y"].to_numpy(),
            tests=test["tests"].to_numpy(),
            urban=test["urban"].to_numpy(bool),
            mean=gp["mean"][te] + part.shift,
            var=part.tile_var,
            noise=part.noise_var,
            persistent=part.persistent_var,
            min_tests=min_tests,
        )

    result: dict[str, Any] = {"run": str(run), "target": target}
    names = variants(choosing_tests)
    for name in names:
        with variant(name):
            layer = fit_run_local_layer(model, effect, n_train=int(tr.sum()), val=val)
            xy = tile_positions(tiles[te], lat0=layer.params.lat0, lon0=layer.params.lon0)
            levels = test_levels(layer, xy, min_tests=QUIET_TESTS)
            validation_at = validation_tile_levels_at(model, layer, n_train=int(tr.sum()), val=val)
            at_floor = validation_at(0.0)
        busy = tile_tests.reindex(levels["tile"].to_numpy()).to_numpy() >= MIN_TESTS
        result[name] = {
            "place_share": layer.params.place_share,
            "place_share_by_group": layer.params.place_share_by_group,
            "latent_scale": layer.unseen_latent_scale,
            "busy": _coverage(levels[busy]),
            "quiet": _coverage(levels[~busy]),
            "validation_at_floor": _coverage(at_floor),
        }
        if name == names[0]:
            result["rules"] = _rules(
                layer,
                validation_at,
                lambda c, layer=layer, xy=xy: test_levels(layer_at_share(layer, c), xy),
            )
    return result


def _spread(values: list[float]) -> str:
    """``mean |coverage - 95|``, how many in 95 ± 2 and the range, of coverages in percent."""
    inside = sum(93 <= v <= 97 for v in values)
    return (
        f"mean |c - 95| {sum(abs(v - 95) for v in values) / len(values):.2f}, "
        f"{inside} of {len(values)} in 95 ± 2, {min(values):.1f}–{max(values):.1f}%"
    )


def table(folder: Path) -> str:
    """Per run and variant: the shares and the coverage of busy and quiet test tiles; then,
    per variant, the tiles pooled and the runs' spread about 95%, and per rule the urban and
    rural groups' (``rules``)."""
    lines = [
        "| run | variant | shares | validation at the floor: all / urban / rural "
        "| busy: all / urban / rural | quiet: all / urban / rural |",
        "|---|---|---|---|---|---|",
    ]
    pooled: dict[tuple[str, str, str], list[float]] = {}
    per_run: dict[tuple[str, str, str], list[float]] = {}
    rules: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("*.json")):
        res = json.loads(path.read_text())
        for name in (k for k in res if k not in ("run", "target", "rules")):
            r = res[name]
            cells = []
            for kind in ("validation_at_floor", "busy", "quiet"):
                parts = []
                for group in ("all", "urban", "rural"):
                    g = r[kind][group]
                    if g["coverage95"] is None:
                        parts.append("–")
                        continue
                    parts.append(f"{100 * g['coverage95']:.1f}")
                    acc = pooled.setdefault((name, kind, group), [0.0, 0.0])
                    acc[0] += g["tiles"]
                    acc[1] += g["coverage95"] * g["tiles"]
                    per_run.setdefault((name, kind, group), []).append(100 * g["coverage95"])
                cells.append(" / ".join(parts))
            shares = f"{r['place_share']:.2f} {r['place_share_by_group'] or ''}"
            lines.append(f"| {path.stem} | {name} | {shares} | {' | '.join(cells)} |")
        for group in res.get("rules", {}).values():
            for rule in ("conformal", "nll", "median"):
                rules.setdefault(rule, []).append(
                    (group["test_tiles"], 100 * group[rule]["coverage95"])
                )
    lines.append("")
    for key, (n, hit) in pooled.items():
        if key[1] == "validation_at_floor":
            continue
        name, kind, group = key
        lines.append(
            f"- {name}, {kind} {group}: {100 * hit / n:.1f}% of {int(n)} tiles; runs: "
            f"{_spread(per_run[key])}"
        )
    for rule, groups in rules.items():
        tiles = sum(n for n, _ in groups)
        hit = sum(n * c for n, c in groups) / tiles
        below = sum(c < 93 for _, c in groups)
        lines.append(
            f"- rule {rule}: {hit:.1f}% of {tiles} busy test tiles; urban and rural groups: "
            f"{_spread([c for _, c in groups])}, {below} below 93%"
        )
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
    p.add_argument(
        "--choosing-tests",
        type=int,
        default=CHOOSING_TESTS,
        help="tests from which the `chosen on` variant's validation tiles choose the share "
        "(default: %(default)s)",
    )
    args = p.parse_args(argv)
    result = measure(args.run, args.target, choosing_tests=args.choosing_tests)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
