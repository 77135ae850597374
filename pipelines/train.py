"""``geodbk train``: fit DBK-RBF (dPPGP) on a run's tiles and save the model bundle.

Reads ``RUN/tiles.parquet`` (train split to fit, val split to pick the best epoch) and writes
``RUN/models/TARGET/``: the estimator's bundle (``weights.safetensors`` + ``model.json``, whose
metadata holds the input scaling, target transform, config and its hash, training history,
timings and library version), ``config.yaml`` (the full resolved config), ``history.csv`` and
``checkpoints/`` (resume state, one checkpoint per epoch).
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from geodbk import __version__
from geodbk.atomic import atomic_write_text
from geodbk.errors import DataError, RunDirectoryError
from pipelines.config import TrainConfig, dump_config, load_config
from pipelines.rundir import (
    TARGETS,
    RunDir,
    config_hash,
    load_tiles,
    require_run,
    scaling_of,
    target_spec,
)

log = logging.getLogger("geodbk")

EPILOG = """\
examples:
  geodbk train --run runs/hawaii --target download
  geodbk train --run runs/hawaii --target upload --config small.yaml --epochs 100
  geodbk train --run runs/hawaii --target download --resume      # continue a killed run

The config file is YAML with any of the keys: expansion, objective, rank, hidden, alpha, beta,
batch_size, epochs, lr, weight_decay, patience, device, seed, predict_chunk_size.
Flags override the file; the file overrides the defaults (the seed's Ookla settings).
exit codes: 0 ok, 2 usage, 3 bad data/config, 4 bad model file, 5 missing run directory.
"""


def register(subparsers: Any) -> None:
    """Add the ``train`` sub-command."""
    p = subparsers.add_parser(
        "train",
        help="train a DBK-RBF (dPPGP) model for one target",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", required=True, type=Path, help="run directory (from geodbk ingest)")
    p.add_argument("--target", required=True, choices=list(TARGETS), help="what to model")
    p.add_argument("--config", type=Path, default=None, help="YAML file overriding the defaults")
    p.add_argument("--epochs", type=int, default=None, help="maximum epochs (overrides config)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="device")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    run_train(
        args.run,
        target=args.target,
        config_path=args.config,
        epochs=args.epochs,
        device=args.device,
        resume=args.resume,
        progress=not args.no_progress,
    )
    return 0


def resolve_config(
    *,
    config_path: str | Path | None = None,
    base: TrainConfig | None = None,
    epochs: int | None = None,
    device: str | None = None,
) -> TrainConfig:
    """Defaults (or ``base``) < YAML file < flags."""
    cfg = load_config(config_path, base=base)
    return cfg.replace(epochs=epochs, device=device)


def split_arrays(
    gdf: Any, target: str, *, source: Path
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return ``{"train"|"val"|"test": (X (n, 2), y (n,))}`` for ``target`` (finite rows only)."""
    spec = target_spec(target)
    for col in ("x1", "x2", spec.log_column, "split"):
        if col not in gdf.columns:
            raise DataError(f"tiles.parquet has no {col!r} column; re-run `geodbk ingest`")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in ("train", "val", "test"):
        part = gdf[gdf["split"] == name]
        X = part[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True)
        y = part[spec.log_column].to_numpy(dtype=np.float64)
        ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
        out[name] = (X[ok], y[ok])
    if len(out["train"][1]) < 2:
        raise DataError(f"{source}: fewer than 2 usable training rows for {target}")
    return out


def _history_csv(history: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = ["epoch", "train_loss", "val_nll", "seconds"]
    extra = sorted({k for row in history for k in row} - set(keys))
    writer = csv.DictWriter(buf, fieldnames=keys + extra, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow(row)
    return buf.getvalue()


def _resume_keys(cfg: TrainConfig) -> dict[str, Any]:
    """Config keys that must match to resume (epochs, patience and chunking may change)."""
    d = cfg.to_dict()
    for key in ("epochs", "patience", "predict_chunk_size", "device"):
        d.pop(key)
    return d


def _check_resume(ckpt_dir: Path, cfg: TrainConfig, resume: bool) -> bool:
    """Decide whether to resume; refuse to resume with a different config."""
    saved = ckpt_dir / "config.yaml"
    has_state = ckpt_dir.is_dir() and any(ckpt_dir.iterdir())
    if not resume:
        return False
    if not has_state:
        log.warning("--resume: no checkpoint in %s; training from scratch", ckpt_dir)
        return False
    if saved.is_file() and _resume_keys(load_config(saved)) != _resume_keys(cfg):
        raise RunDirectoryError(
            f"--resume: the checkpoint in {ckpt_dir} was made with a different config "
            f"({saved}); resume with the same --config/--epochs/--device or train without --resume"
        )
    return True


def run_train(
    run: str | Path,
    *,
    target: str,
    config: TrainConfig | None = None,
    config_path: str | Path | None = None,
    epochs: int | None = None,
    device: str | None = None,
    resume: bool = False,
    progress: bool = True,
) -> Path:
    """Train one target and write ``RUN/models/TARGET/``; return that folder.

    Parameters
    ----------
    run
        Ingested run directory.
    target
        ``download``, ``upload`` or ``latency``.
    config
        Base config (default: :class:`TrainConfig` defaults); the file and flags override it.
    config_path
        Optional YAML file.
    epochs, device
        Flag overrides.
    resume
        Continue from ``checkpoints/`` when present (same config required).
    progress
        Show a progress bar with the loss and validation NLL.
    """
    from geodbk import DBKRegressor

    rd: RunDir = require_run(run)
    spec = target_spec(target)
    cfg = resolve_config(config_path=config_path, base=config, epochs=epochs, device=device)
    gdf, meta = load_tiles(rd)
    scaling = scaling_of(meta, source=rd.tiles)
    parts = split_arrays(gdf, target, source=rd.tiles)
    (X, y), (Xv, yv) = parts["train"], parts["val"]
    model_dir = rd.model_dir(target)
    ckpt_dir = rd.checkpoint_dir(target)
    do_resume = _check_resume(ckpt_dir, cfg, resume)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ckpt_dir / "config.yaml", dump_config(cfg))
    log.info(
        "training %s on %d rows (val %d) with %s; checkpoints in %s%s",
        target,
        len(y),
        len(yv),
        cfg.to_dict(),
        ckpt_dir,
        " (resuming)" if do_resume else "",
    )
    model = DBKRegressor(**cfg.estimator_kwargs())
    t0 = time.perf_counter()
    model.fit(
        X,
        y,
        Xv if len(yv) else None,
        yv if len(yv) else None,
        checkpoint_dir=ckpt_dir,
        resume=do_resume,
        progress=progress,
    )
    fit_s = time.perf_counter() - t0
    history = [dict(row) for row in getattr(model, "history_", [])]
    metadata = {
        "target": target,
        "column": spec.column,
        "log_column": spec.log_column,
        "unit": spec.unit,
        "target_transform": f"log10({spec.column}); natural = 10**y / {spec.divisor:g} {spec.unit}",
        "inputs": ["x1", "x2"],
        "input_scaling": scaling,
        "config": cfg.to_dict(),
        "config_hash": config_hash(cfg.to_dict()),
        "run": str(rd.root),
        "n_train": len(y),
        "n_val": len(yv),
        "y_train_mean": float(np.mean(y)),
        "y_train_sd": float(np.std(y)),
        "best_epoch": getattr(model, "best_epoch_", None),
        "history": history,
        "timings": {
            "fit_seconds": fit_s,
            "epochs_run": len(history),
            "seconds_per_epoch": fit_s / max(len(history), 1),
        },
        "geodbk_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "tiles_metadata": {k: meta.get(k) for k in ("type", "quarters", "region", "split")},
    }
    model.save(model_dir, metadata=metadata)
    atomic_write_text(model_dir / "config.yaml", dump_config(cfg))
    atomic_write_text(model_dir / "history.csv", _history_csv(history))
    log.info(
        "wrote %s (best epoch %s of %d, %.1f s)",
        model_dir,
        metadata["best_epoch"],
        len(history),
        fit_s,
    )
    return model_dir


def load_model(rd: RunDir, target: str) -> Any:
    """Load the bundle of ``target`` (raises ModelFileError with the train command if absent)."""
    from geodbk import DBKRegressor
    from pipelines.rundir import require_model

    path = require_model(rd, target)
    model = DBKRegressor.load(path)
    md = getattr(model, "metadata_", None) or {}
    if md.get("target") not in (None, target):
        from geodbk.errors import ModelFileError

        raise ModelFileError(f"{path} holds a {md.get('target')!r} model, not {target!r}")
    log.info("read model %s", path)
    return model
