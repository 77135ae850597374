"""``geodbk export``: GeoTIFF / COG uncertainty maps from the predictive grids.

For each target, reads ``RUN/grids/TARGET.nc`` and writes ``RUN/exports/TARGET.tif``, one
float32 band per grid variable (band description = "NAME: QUANTITY", e.g. "std: single speed test
(tests=1)", or the name for older grids; nodata -9999 outside the
region; DEFLATE; COG with overviews for ``--format cog``) and ``RUN/exports/TARGET.json``, the
provenance sidecar: run, target, model path, config hash, grid file, bands, format, created,
geodbk version.
"""

from __future__ import annotations

import argparse
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from geodbk import __version__
from geodbk.atomic import atomic_write_json
from geodbk.errors import ModelFileError, RunDirectoryError
from geodbk.geo.geotiff import DEFAULT_NODATA, write_geotiff
from pipelines.rundir import (
    TARGETS,
    RunDir,
    read_json,
    require_grid,
    require_model,
    require_run,
    target_spec,
)

log = logging.getLogger("geodbk")

EPILOG = """\
examples:
  geodbk export --run runs/hawaii --target download
  geodbk export --run runs/hawaii --all --format cog
  geodbk export --run runs/hawaii --all runs/georgia runs/newmexico   # several runs at once

exit codes: 0 ok, 2 usage, 4 missing model, 5 missing run directory or grid (run predict first).
"""


def register(subparsers: Any) -> None:
    """Add the ``export`` sub-command."""
    p = subparsers.add_parser(
        "export",
        help="write GeoTIFF/COG uncertainty maps (exports/TARGET.tif + .json)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN2", help="more run directories")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--target", choices=list(TARGETS), help="one target")
    g.add_argument("--all", action="store_true", help="every trained target (the default)")
    p.add_argument("--format", choices=["gtiff", "cog"], default="gtiff", help="file format")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    for run in [args.run, *args.runs]:
        run_export(run, target=args.target, fmt=args.format)
    return 0


def grid_variables(ds: Any) -> list[str]:
    """Band order: the float (y, x) variables of a grid, ``in_region`` excluded."""
    return [
        str(n)
        for n, v in ds.data_vars.items()
        if v.dims == ("y", "x") and n != "in_region" and v.dtype.kind == "f"
    ]


def band_descriptions(ds: Any, bands: list[str]) -> list[str]:
    """``"NAME: QUANTITY"`` per band (e.g. ``std: single speed test (tests=1)``, ``std_f:
    latent mean f(x)``), or the bare name for grids written before the ``quantity`` attribute."""
    out = []
    for b in bands:
        q = ds[b].attrs.get("quantity")
        out.append(f"{b}: {q}" if q else b)
    return out


def export_target(rd: RunDir, target: str, *, fmt: str = "gtiff") -> Path:
    """Export one target of one run; return the ``.tif`` path."""
    import xarray as xr

    target_spec(target)
    model_dir = require_model(rd, target)
    grid_path = require_grid(rd, target)
    tif = rd.export_tif(target)
    model_json = read_json(model_dir / "model.json")
    md = model_json.get("metadata", model_json)
    with xr.open_dataset(grid_path, decode_coords="all", chunks={"y": 1024}) as ds:
        log.info("read %s", grid_path)
        bands = grid_variables(ds)
        provenance = {
            "run": str(rd.root.resolve()),
            "target": target,
            "model": str(model_dir),
            "config_hash": ds.attrs.get("model_config_hash") or md.get("config_hash"),
            "config": md.get("config"),
            "grid": str(grid_path),
            "grid_created": ds.attrs.get("created"),
            "bands": bands,
            "units": {b: ds[b].attrs.get("units", "") for b in bands},
            "quantity": ds.attrs.get("quantity"),
            "band_descriptions": band_descriptions(ds, bands),
            "nodata": DEFAULT_NODATA,
            "format": fmt,
            "crs": "EPSG:4326",
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "geodbk_version": __version__,
        }
        tags = {
            "geodbk_target": target,
            "geodbk_run": provenance["run"],
            "geodbk_config_hash": str(provenance["config_hash"]),
            "geodbk_version": __version__,
        }
        write_geotiff(
            ds,
            tif,
            variables=bands,
            fmt=fmt,
            tags=tags,
            descriptions=provenance["band_descriptions"],
        )
    atomic_write_json(rd.export_sidecar(target), provenance)
    log.info("wrote %s (%d bands, %s) and %s", tif, len(bands), fmt, rd.export_sidecar(target))
    return tif


def run_export(run: str | Path, *, target: str | None = None, fmt: str = "gtiff") -> list[Path]:
    """Export ``target`` (or every trained target) of ``run``; return the written files.

    Raises
    ------
    RunDirectoryError
        Missing run directory or grid (with the predict command to run).
    ModelFileError
        ``target`` untrained, or no target trained at all.
    """
    rd = require_run(run)
    targets = [target] if target else rd.trained_targets()
    if not targets:
        raise ModelFileError(
            f"no trained model in {rd.root / 'models'}; run `geodbk train --run {rd.root} "
            "--target download` first"
        )
    out = []
    for t in targets:
        if not rd.grid(t).is_file() and target is None:
            raise RunDirectoryError(
                f"{rd.grid(t)} is missing for trained target {t}; run "
                f"`geodbk predict --run {rd.root} --target {t}` first"
            )
        out.append(export_target(rd, t, fmt=fmt))
    return out
