"""``geodbk train``: fit DBK-RBF (dPPGP) on a run's tiles and save the model bundle.

Reads ``RUN/tiles.parquet`` (train split to fit, val split to pick the best epoch) and writes
``RUN/models/TARGET/``: the estimator's bundle (``weights.safetensors`` + ``model.json``, whose
metadata holds the input scaling, target transform, config and its hash, training history,
timings and library version), ``config.yaml`` (the full resolved config), ``history.csv`` and
``checkpoints/`` (resume state, one checkpoint per epoch).

``--time`` trains a time-aware model: its inputs are ``[x1, x2, t]``, ``t`` the tile's quarter
scaled to [-1, 1] over the quarter range of the train split (metadata ``time_scaling``), so that
``geodbk predict --quarter`` can map any quarter and ``--trend`` the change between two. Without
it the quarters are pooled (inputs ``[x1, x2]``).
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import os
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from geodbk import DBKRegressor, __version__
from geodbk.atomic import atomic_write_text
from geodbk.distributed import init_distributed, seed_rank, shutdown_distributed
from geodbk.errors import DataError
from geodbk.geo.blocks import held_out_units
from geodbk.geo.contract import target_info
from geodbk.geo.parquet_batches import fit_parquet
from geodbk.geo.timeaxis import TimeScaling, quarter_indices
from geodbk.metrics import gaussian_nll
from geodbk.predictive import noise_kwargs
from geodbk.tile_effect import MIN_HOLDOUT_ROWS, choose_objective, fit_tile_effect, urban_groups
from geodbk.training import CHECKPOINT_NAME
from pipelines.bundles import save_tile_effect
from pipelines.cli import FITTING, add_progress_option, call_with_options, stage_parser
from pipelines.config import TrainConfig, check_epochs_flag, dump_config, load_config
from pipelines.layers import (
    ValidationRows,
    fit_run_local_layer,
    save_local_layer,
    with_effect_place_share,
)
from pipelines.rundir import (
    RunDir,
    config_hash,
    load_tiles,
    locked_stage,
    require_run,
    scaling_of,
    target_spec,
)
from pipelines.sharding import load_rank_split, read_time_axis, streaming_inputs
from pipelines.training_data import (
    MIN_GROUP_VAL_ROWS,
    noise_columns,
    noise_covariates,
    resolve_noise,
    smaller_class_rows,
    split_arrays,
    split_tests,
    time_axis,
    urban_classes,
)

log = logging.getLogger("geodbk")

#: What ``geodbk train --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Fit the default model (DBK-RBF trained with the dPPGP objective) for one target of a run.

Reads RUN/tiles.parquet: the train split fits the model, the val split picks the best epoch
and stops training early. Writes RUN/models/TARGET/: the model (weights.safetensors and
model.json, with the input scaling, target transform, config and training history),
config.yaml (the full resolved config), history.csv and checkpoints/ for --resume.
When the tiles span two or more quarters it then fits each tile's own offset (the tile
effect) and the local layer that lets a tile borrow from its measured neighbours; these make
the default `tile` maps of `geodbk predict`. Details: docs/cli.md, "geodbk train".
"""

EPILOG = """\
examples:
  geodbk train --run runs/hawaii --target download
  geodbk train --run runs/hawaii --target upload --config small.yaml --epochs 100
  geodbk train --run runs/hawaii --target download --resume      # continue a killed run
  geodbk train --run runs/hawaii --target download --time        # quarter as an input

{config_keys}
--noise tests+devices (config `noise: tests+devices`): s2_i = s2_floor + s2_meas/tests_i +
s2_dev/devices_i from the `tests` and `devices` columns (missing or < 1 counts as 1).
--noise tests+urban / tests+devices+urban: the floor s2_floor is learned per urban/rural class
(the `urban` column; needs urban and rural training tiles, i.e. an urban layer at ingest).
Neither with --streaming. The default `auto` is tests+devices when the table has both columns
(in memory or --distributed), else tests (or constant without `tests`).
--time (config `time: true`): inputs [x1, x2, t], t = the quarter scaled to [-1, 1] over the
train split's quarters (needs at least 2 of them); then `geodbk predict --quarter/--trend`.
--tile-effect (default when the tiles span 2+ quarters and have a val split): each tile's own
persistent offset, learned from its other quarters, with its own spread (tau²) for urban and
rural tiles (--tile-effect-groups auto|urban|none); the report scores the test tiles with it.
Flags override the file; the file overrides the defaults (the settings of the DBK paper for Ookla data: docs/decisions/defaults.md).
exit codes: 0 ok, 2 usage, 3 bad data/config, 4 bad model file, 5 missing run directory.
"""


def register(subparsers: Any) -> None:
    """Add the ``train`` sub-command."""
    p = stage_parser(
        subparsers,
        "train",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG.format(config_keys=_config_keys_sentence()),
        **FITTING,
    )
    p.add_argument(
        "--config",
        type=Path,
        dest="config_path",
        metavar="CONFIG",
        help="YAML file overriding the defaults",
    )
    p.add_argument("--epochs", type=int, default=None, help="maximum epochs (overrides config)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="device")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    add_progress_option(p)
    p.add_argument(
        "--noise",
        choices=["tests", "tests+devices", "tests+urban", "tests+devices+urban", "constant"],
        default=None,
        help="observation noise: per tile s2_floor + s2_meas/tests, tests+devices (adds "
        "s2_dev/devices from the `devices` column), +urban (s2_floor per urban/rural class; "
        "devices and urban not with --streaming) or one constant s2; default: "
        "tests+devices when the tiles have `tests` and `devices` (tests out of core)",
    )
    p.add_argument(
        "--time",
        action="store_true",
        default=None,
        help="time-aware model: the quarter is an input (x1, x2, t); default: quarters pooled",
    )
    p.add_argument(
        "--tile-effect",
        dest="tile_effect",
        action="store_const",
        const="on",
        default=None,
        help="add a per-tile offset learned from each tile's other quarters (AR(1) over "
        "quarters, chosen by validation NLL, or on tile and block splits by the NLL of "
        "held-out training rows; config `tile_effect: on`); in memory only. Default (`auto`): "
        "on in memory when the tiles span 2+ quarters, have a val split and either kind of "
        "objective rows",
    )
    p.add_argument(
        "--no-tile-effect",
        dest="tile_effect",
        action="store_const",
        const="off",
        help="no per-tile offset: every product is the GP alone (config `tile_effect: off`)",
    )
    p.add_argument(
        "--tile-effect-groups",
        choices=("auto", "urban", "none"),
        default=None,
        help="tile groups with their own offset variance: urban (urban and rural tiles), none "
        "(one for all) or auto (default: urban when the tiles have `urban` and each class has "
        "100+ objective rows; config `tile_effect_groups`)",
    )
    p.add_argument(
        "--no-local-layer",
        dest="local_layer",
        action="store_const",
        const="off",
        default=None,
        help="keep the tile effect alone: no short-range spatial field pulling a tile toward "
        "its measured neighbours (config `local_layer: off`; default auto = on with the tile "
        "effect)",
    )
    p.add_argument(
        "--distributed",
        action="store_true",
        help="data-parallel training under torchrun (DDP; see docs/scaling.md)",
    )
    p.add_argument(
        "--streaming",
        action="store_true",
        default=None,
        help="out-of-core: read the train split from tiles.parquet in shuffled windows of row "
        "groups, so memory does not grow with the table (config `streaming: true`)",
    )


def _main(args: argparse.Namespace) -> int:
    try:
        call_with_options(run_train, args)
    finally:
        if args.distributed:
            shutdown_distributed()
    return 0


def resolve_config(
    *, config_path: str | Path | None = None, base: TrainConfig | None = None, **flags: Any
) -> TrainConfig:
    """Defaults (or ``base``) < YAML file < ``flags``, the flag overrides of
    :func:`run_train` named as config fields (``None``: not given; ``tile_effect`` may be a
    bool)."""
    check_epochs_flag(flags.get("epochs"))
    cfg = load_config(config_path, base=base)
    if isinstance(flags.get("tile_effect"), bool):
        flags["tile_effect"] = "on" if flags["tile_effect"] else "off"
    return cfg.replace(**flags)


def tile_effect_objective(gdf: Any, target: str, *, seed: int = 0) -> tuple[str, np.ndarray]:
    """The rows that would choose the tile effect's parameters for ``target``
    (:func:`geodbk.tile_effect.choose_objective` of the ``quadkey`` column, rows as in
    :func:`split_tests`): ``("validation", mask over the val rows)`` or ``("training
    hold-out", mask over the train rows)``."""

    tiles = split_tests(gdf, target, column="quadkey")
    return choose_objective(tiles["train"], tiles["val"], seed=seed)


def resolve_tile_effect(
    cfg: TrainConfig,
    gdf: Any,
    *,
    target: str,
    n_val: int,
    source: Path | str = "tiles.parquet",
) -> TrainConfig:
    """Resolve ``tile_effect: auto`` for in-memory training, and check an explicit ``on``.

    The effect learns from a tile's other quarters and chooses its parameters on rows of
    measured tiles (:func:`tile_effect_objective`): validation rows whose tile has training
    rows, or, on tile and block splits where (almost) none has, a seeded hold-out of one row of
    multi-row training tiles. ``auto`` becomes ``on`` when the table has ``quadkey`` and
    ``quarter`` columns with at least 2 distinct quarters, a validation split and at least
    :data:`geodbk.tile_effect.MIN_HOLDOUT_ROWS` objective rows, else ``off`` (logged). ``on``
    without them raises :class:`DataError` naming the fix, before any training.
    """

    if cfg.tile_effect == "off":
        return cfg
    has_tiles = "quadkey" in gdf.columns
    quarters = gdf["quarter"].nunique() if "quarter" in gdf.columns else 1
    kind, rows = "none", 0
    if has_tiles and "split" in gdf.columns:
        kind, mask = tile_effect_objective(gdf, target, seed=cfg.seed)
        rows = int(mask.sum())
    ok = has_tiles and quarters >= 2 and n_val > 0 and rows >= MIN_HOLDOUT_ROWS
    if cfg.tile_effect == "auto":
        if ok:
            log.info("tile effect on: parameters chosen on %d %s rows", rows, kind)
        else:
            log.info(
                "tile effect off: it needs a quadkey column, 2+ quarters, a val split and %d+ "
                "rows of measured tiles to choose its parameters (%s quarters, %d val rows, %d "
                "objective rows)",
                MIN_HOLDOUT_ROWS,
                quarters,
                n_val,
                rows,
            )
        return cfg.replace(tile_effect="on" if ok else "off")
    if not has_tiles:
        raise DataError(
            f"--tile-effect needs a 'quadkey' column in {source}; re-run `geodbk ingest`, or "
            "train with --no-tile-effect"
        )
    if n_val == 0:
        raise DataError(
            "--tile-effect conditions on the validation rows but the val split of "
            f"{source} is empty; re-ingest with a validation share (geodbk ingest --split) or "
            "train with --no-tile-effect"
        )
    if quarters < 2 or rows < MIN_HOLDOUT_ROWS:
        raise DataError(
            f"--tile-effect learns from a tile's other quarters, but {source} has {quarters} "
            f"quarter(s), and {rows} rows of measured tiles ({kind}) to choose its parameters "
            f"on (at least {MIN_HOLDOUT_ROWS} needed: validation rows whose tile has training "
            "rows, or one held-out row of training tiles measured in 2+ quarters); ingest more "
            "quarters or train with --no-tile-effect"
        )
    return cfg


def resolve_local_layer(cfg: TrainConfig) -> TrainConfig:
    """Resolve ``local_layer: auto`` (``on`` exactly when the tile effect is) and refuse an
    explicit ``on`` without the tile effect, which the layer sits on."""
    if cfg.local_layer == "auto" or cfg.tile_effect != "on":
        if cfg.local_layer == "on" and cfg.tile_effect != "on":
            raise DataError(
                "local_layer: on needs the tile effect, which is off for this run (a single "
                "quarter, no validation split, --streaming/--distributed or --no-tile-effect); "
                "drop `local_layer: on` or turn the tile effect on"
            )
        return cfg.replace(local_layer="on" if cfg.tile_effect == "on" else "off")
    return cfg


def _history_csv(history: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = ["epoch", "train_loss", "val_nll", "seconds"]
    extra = sorted({k for row in history for k in row} - set(keys))
    writer = csv.DictWriter(buf, fieldnames=keys + extra, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow(row)
    return buf.getvalue()


#: Config keys a resumed run may change: the budget, the device, chunking, and the tile
#: effect and local layer, which are fitted after training.
RESUME_FREE_KEYS = (
    "epochs",
    "patience",
    "predict_chunk_size",
    "device",
    "tile_effect",
    "tile_effect_groups",
    "local_layer",
    "local_layer_neighbours",
)


def _resume_keys(cfg: TrainConfig) -> dict[str, Any]:
    """Config keys that must match to resume (all but :data:`RESUME_FREE_KEYS`),
    ``kernel_update_every`` resolved."""
    d = {**cfg.to_dict(), "kernel_update_every": cfg.resolved_kernel_update_every()}
    for key in RESUME_FREE_KEYS:
        d.pop(key)
    return d


class CheckpointStash:
    """Set ``checkpoints/last.pt`` and ``checkpoints/config.yaml`` aside (renamed to hidden
    files: no room needed on a full disk) while a fresh training starts; put them back when it
    fails before writing a checkpoint of its own, drop them once it has one or has finished.
    The folder then always holds a matching pair: the old one, the new one, or a new config
    alone (after a kill, which :meth:`sweep` cleans up at the next start).

    Use as a context manager around writing the new config and fitting; ``active=False``
    (resuming, or a distributed rank that writes nothing) makes it do nothing.
    """

    FILES = (CHECKPOINT_NAME, "config.yaml")
    PREFIX = ".previous-"

    def __init__(self, folder: Path, *, active: bool) -> None:
        self.folder = folder
        self.active = active
        self.kept: list[str] = []

    @classmethod
    def sweep(cls, folder: Path) -> None:
        """Remove what a killed training set aside (its new config stands alone)."""
        for leftover in folder.glob(f"{cls.PREFIX}*"):
            leftover.unlink(missing_ok=True)

    def _aside(self, name: str) -> Path:
        return self.folder / f"{self.PREFIX}{name}"

    def __enter__(self) -> CheckpointStash:
        if self.active:
            for name in self.FILES:
                if (self.folder / name).is_file():
                    os.replace(self.folder / name, self._aside(name))
                    self.kept.append(name)
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if not self.active:
            return
        failed_first = exc is not None and not (self.folder / CHECKPOINT_NAME).is_file()
        if failed_first:  # nothing of the new training to resume: the old pair comes back
            (self.folder / "config.yaml").unlink(missing_ok=True)
            for name in self.kept:
                os.replace(self._aside(name), self.folder / name)
            if self.kept:
                log.info("kept the earlier checkpoint in %s", self.folder)
        else:
            for name in self.kept:
                self._aside(name).unlink(missing_ok=True)


def _config_keys_sentence() -> str:
    """The help's sentence listing every config key (:class:`TrainConfig`'s fields)."""
    keys = ", ".join(TrainConfig().to_dict())
    return textwrap.fill(f"The config file is YAML with any of the keys: {keys}.", width=96)


def _check_resume(ckpt_dir: Path, cfg: TrainConfig, resume: bool) -> bool:
    """Decide whether to resume; refuse to resume with a different config."""
    saved = ckpt_dir / "config.yaml"
    has_state = ckpt_dir.is_dir() and any(not p.name.startswith(".") for p in ckpt_dir.iterdir())
    if not resume:
        return False
    if not has_state:
        log.warning("--resume: no checkpoint in %s; training from scratch", ckpt_dir)
        return False
    if saved.is_file():
        # a config saved before kernel_update_every existed was trained with 1
        before = _resume_keys(load_config(saved, base=TrainConfig(kernel_update_every=1)))
        now = _resume_keys(cfg)
        differ = sorted(k for k in now if before[k] != now[k])
        if differ:
            changes = ", ".join(f"{k}: {before[k]!r} there, {now[k]!r} now" for k in differ)
            raise DataError(
                f"--resume: the checkpoint in {ckpt_dir} was made with a different config "
                f"({saved}; {changes}); resume with the checkpoint's config (`--config "
                f"{saved} --resume`; {', '.join(RESUME_FREE_KEYS)} may change) or train "
                "without --resume"
            )
    return True


@locked_stage("train")
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
    distributed: bool = False,
    noise: str | None = None,
    time: bool | None = None,
    streaming: bool | None = None,
    tile_effect: str | bool | None = None,
    tile_effect_groups: str | None = None,
    local_layer: str | None = None,
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
    distributed
        Data-parallel training under ``torchrun`` (one process per device): each rank reads
        its shard of the train split; only rank 0 writes checkpoints and the bundle.
    noise
        ``tests``, ``tests+devices`` (reads the ``devices`` column too; missing or < 1 counts
        as 1), ``tests+urban`` / ``tests+devices+urban`` (a floor per urban/rural class, from
        the ``urban`` column) or ``constant`` (flag override of the config's ``noise``;
        ``auto``, the default, is resolved by :func:`resolve_noise`).
    time
        Flag override of the config's ``time``: a time-aware model with inputs ``[x1, x2, t]``
        (``t``: the quarter scaled over the train split's quarter range; see :func:`time_axis`).
        Its metadata gains ``time_scaling`` and ``quarters`` (all the table's quarters).
    streaming
        Flag override of the config's ``streaming``: out-of-core training with
        :func:`geodbk.geo.parquet_batches.fit_parquet` (the train split is never held in memory;
        checkpoints and ``resume`` work as in memory). Not with ``distributed``.
    tile_effect
        Flag override of the config's ``tile_effect`` (``"on"``/``True``, ``"off"``/``False``;
        ``auto``, the default, is resolved by :func:`resolve_tile_effect`, and is ``off`` under
        ``streaming`` and ``distributed``): after training, fit a per-tile offset
        (:func:`fit_run_tile_effect`) and save it with the model; its parameters go to the
        metadata's ``tile_effect``.
    tile_effect_groups
        Flag override of the config's ``tile_effect_groups`` (``auto``, ``urban``, ``none``;
        resolved by :func:`resolve_tile_effect_groups` before training when the tile effect is
        on).
    local_layer
        Flag override of the config's ``local_layer`` (``auto`` = ``on`` with the tile
        effect, ``off``): fit the spatial field over tile offsets
        (:func:`pipelines.layers.fit_run_local_layer`) after the tile effect; its parameters go
        to the metadata's ``local_layer``.
    """

    rd: RunDir = require_run(run)
    spec = target_spec(target)
    cfg = resolve_config(
        config_path=config_path,
        base=config,
        epochs=epochs,
        device=device,
        noise=noise,
        time=time,
        streaming=streaming,
        tile_effect=tile_effect,
        tile_effect_groups=tile_effect_groups,
        local_layer=local_layer,
    )
    if cfg.tile_effect == "on" and distributed:
        raise DataError(
            "--tile-effect is not supported with --distributed yet; train in one process "
            "(drop --distributed) or use --no-tile-effect"
        )
    if (cfg.streaming or distributed) and cfg.tile_effect == "auto":
        log.info(
            "tile effect off: it needs the train split in memory in one process (%s)",
            "--streaming" if cfg.streaming else "--distributed",
        )
        cfg = cfg.replace(tile_effect="off")
    effect_asked = cfg.tile_effect  # "auto" may yet give way to the GP alone (below)
    if cfg.streaming and distributed:
        raise DataError(
            "--streaming and --distributed cannot be combined yet: --distributed already reads "
            "only each rank's row groups; drop one of the two flags"
        )
    shards = None
    stream: dict[str, Any] | None = None
    noise_kw: dict[str, Any] = {}
    time_scaling: TimeScaling | None = None
    quarters: list[str] = []
    if distributed:
        import pyarrow.parquet as pq

        if cfg.time:  # from the whole table's quarter/split columns: identical on every rank
            time_scaling, quarters = read_time_axis(rd)
        columns = pq.read_schema(rd.tiles).names
        classes = 0
        if "urban" in columns:  # two small columns, the same on every rank
            flags = pq.read_table(rd.tiles, columns=["urban", "split"])
            classes = urban_classes(
                flags.column("urban").to_numpy(zero_copy_only=False),
                flags.column("split").to_numpy(zero_copy_only=False),
            )
        cfg = resolve_noise(cfg, columns, source=rd.tiles, urban_classes=classes)
        ctx = init_distributed(
            device=cfg.device,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )
        seed_rank(cfg.seed, ctx.rank)
        meta, (X, y), (Xv, yv), shards, noise_kw = load_rank_split(
            rd,
            target,
            ctx=ctx,
            time_scaling=time_scaling,
            covariates=noise_columns(cfg.noise),
        )
    elif cfg.streaming:
        cfg, meta, time_scaling, quarters, stream = streaming_inputs(rd, target, cfg)
        Xv, yv = stream["X_val"], stream["y_val"]
        y = np.zeros(stream["n_train"])  # only its length is used below
    else:
        gdf, meta = load_tiles(rd, geometry=False)
        if cfg.time:
            if "quarter" not in gdf.columns:
                raise DataError(f"{rd.tiles} has no 'quarter' column; --time needs one")
            time_scaling, quarters = time_axis(gdf["quarter"], gdf["split"], source=rd.tiles)
        parts = split_arrays(gdf, target, source=rd.tiles, time_scaling=time_scaling)
        (X, y), (Xv, yv) = parts["train"], parts["val"]
        classes = urban_classes(gdf["urban"], gdf["split"])
        cfg = resolve_noise(cfg, gdf.columns, source=rd.tiles, urban_classes=classes)
        cfg = resolve_tile_effect(cfg, gdf, target=target, n_val=len(yv), source=rd.tiles)
        if cfg.tile_effect == "on":
            cfg = resolve_tile_effect_groups(cfg, gdf, target, source=rd.tiles)
        noise_kw = noise_covariates(gdf, target, cfg.noise)
    cfg = resolve_local_layer(cfg)
    cfg = cfg.replace(kernel_update_every=cfg.resolved_kernel_update_every())
    scaling = scaling_of(meta, source=rd.tiles)
    is_main = shards is None or shards.is_main
    model_dir = rd.model_dir(target)
    ckpt_dir = rd.checkpoint_dir(target)
    do_resume = _check_resume(ckpt_dir, cfg, resume)
    if is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        CheckpointStash.sweep(ckpt_dir)  # what a killed train set aside
    # a fresh start sets the old state and its config aside (never pairing them with the new
    # ones) and puts them back if it fails before its first checkpoint
    stash = CheckpointStash(ckpt_dir, active=is_main and not do_resume)
    log.info(
        "training %s on %d rows (val %d) with %s; checkpoints in %s%s",
        target,
        len(y),
        len(yv),
        cfg.to_dict(),
        ckpt_dir,
        " (resuming)" if do_resume else "",
    )
    if time_scaling is not None:
        log.info(
            "time-aware: inputs x1, x2, t with t in [-1, 1] over %s..%s (table quarters %s)",
            time_scaling.first,
            time_scaling.last,
            ", ".join(quarters),
        )
    model = DBKRegressor(**cfg.estimator_kwargs())
    t0 = perf_counter()
    with stash:
        if is_main:
            atomic_write_text(ckpt_dir / "config.yaml", dump_config(cfg))
        if stream is not None:
            fit_parquet(
                model,
                rd.tiles,
                y_column=spec.log_column,
                filters=stream["filters"],
                inputs=stream["inputs"],
                read_columns=stream["read_columns"],
                tests_column="tests" if cfg.noise == "tests" else None,
                X_val=Xv if len(yv) else None,
                y_val=yv if len(yv) else None,
                tests_val=stream["tests_val"] if len(yv) else None,
                checkpoint_dir=ckpt_dir,
                resume=do_resume,
                progress=progress,
            )
        else:
            model.fit(
                X,
                y,
                Xv if len(yv) else None,
                yv if len(yv) else None,
                checkpoint_dir=ckpt_dir,
                resume=do_resume,
                progress=progress and is_main,
                shards=shards,
                **noise_kw,
            )
    fit_s = perf_counter() - t0
    if not is_main:
        return model_dir  # rank 0 writes the bundle
    history = [dict(row) for row in getattr(model, "history_", [])]
    metadata = {
        "target": target,
        "column": spec.column,
        "log_column": spec.log_column,
        "unit": spec.unit,
        "target_transform": f"log10({spec.column}); natural = 10**y / {spec.divisor:g} {spec.unit}",
        "inputs": ["x1", "x2", "t"] if time_scaling is not None else ["x1", "x2"],
        "input_scaling": scaling,
        "config": cfg.to_dict(),
        "config_hash": config_hash(cfg.to_dict()),
        "run": rd.root.resolve().name,
        "n_train": len(y) if shards is None else shards.n_global,
        "n_val": len(yv),
        "y_train_mean": model.y_mean_,
        "y_train_sd": model.y_std_,
        "best_epoch": getattr(model, "best_epoch_", None),
        "noise": model.noise_parameters(),
        "history": history,
        "timings": {
            "fit_seconds": fit_s,
            "epochs_run": len(history),
            "seconds_per_epoch": fit_s / max(len(history), 1),
        },
        "geodbk_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "tiles_metadata": {
            k: meta.get(k) for k in ("type", "quarters", "region", "split", "ingest_id")
        },
    }
    if time_scaling is not None:
        metadata["time_scaling"] = time_scaling.to_dict()
        metadata["quarters"] = quarters
        tv = noise_kw.get("tests_val") if stream is None else stream["tests_val"]
        metadata["time_extrapolation"] = choose_time_extrapolation(
            model,
            Xv,
            yv,
            tests_val=tv,
            devices_val=noise_kw.get("devices_val"),
            urban_val=noise_kw.get("urban_val"),
        )
        log.info("time extrapolation: %s", metadata["time_extrapolation"])
    # the GP first: a failure in a post-fit step never loses the training
    model.save(model_dir, metadata=metadata)
    save_tile_effect(model_dir, None)
    save_local_layer(model_dir, None)
    atomic_write_text(model_dir / "config.yaml", dump_config(cfg))
    atomic_write_text(model_dir / "history.csv", _history_csv(history))
    if cfg.tile_effect == "on":
        effect = layer = None
        step = "the tile effect"
        try:
            effect = fit_run_tile_effect(
                model,
                gdf,
                target,
                parts=parts,
                noise_kw=noise_kw,
                groups=cfg.tile_effect_groups,
                seed=cfg.seed,
            )
            log.info("tile effect: %s", effect.params.to_dict())
            val = validation_rows_of_run(
                gdf, target, parts=parts, noise_kw=noise_kw, cfg=cfg, split=meta.get("split")
            )
            n_train = len(parts["train"][1])
            if cfg.local_layer == "on":
                step = "the local layer"
                layer = fit_run_local_layer(
                    model,
                    effect,
                    n_train=n_train,
                    val=val,
                    neighbours=cfg.local_layer_neighbours,
                )
            else:
                step = "the tile effect's place share"
                effect = with_effect_place_share(model, effect, n_train=n_train, val=val)
        except Exception as exc:  # any failure: the saved GP stays, the message says so
            raise DataError(
                f"the GP was trained and saved to {model_dir} without a tile effect or local "
                f"layer, but fitting {step} failed: {type(exc).__name__}: {exc}. Its maps "
                "use f(x) plus the noise floor for the tile quantity; retrain with "
                "--no-tile-effect to make that the saved choice"
            ) from exc
        worse = worse_than_gp(effect, layer)
        if worse is not None and effect_asked == "auto":
            log.warning("%s: the maps use the GP alone (--tile-effect keeps them)", worse)
            metadata["tile_effect_off"] = worse
            atomic_write_text(
                model_dir / "config.yaml",
                dump_config(cfg.replace(tile_effect="off", local_layer="off")),
            )
        else:
            if worse is not None:
                log.warning("%s; kept, as --tile-effect asks", worse)
            metadata["tile_effect"] = effect.params.to_dict()
            if layer is not None:
                metadata["local_layer"] = layer.params.to_dict()
            save_tile_effect(model_dir, effect)
            save_local_layer(model_dir, layer)
        model.save(model_dir, metadata=metadata)
    log.info(
        "wrote %s (best epoch %s of %d, %.1f s)",
        model_dir,
        metadata["best_epoch"],
        len(history),
        fit_s,
    )
    return model_dir


def worse_than_gp(effect: Any, layer: Any) -> str | None:
    """Why the fitted tile model scores worse than the GP alone, or ``None``: the local layer's
    validation NLL above the GP's on the same validation rows, or (without a layer) the tile
    effect's NLL above the GP's on the rows that chose its parameters."""
    if layer is not None:
        params, gp = layer.params, layer.params.val_nll_gp
        what, rows = "the tile effect and local layer", "the validation rows"
    else:
        params, gp = effect.params, effect.params.val_nll_without
        what, rows = "the tile effect", "the rows that chose its parameters"
    if gp is None or params.val_nll is None or params.val_nll <= gp:
        return None
    return f"{what} score {params.val_nll:.4f} nats per row on {rows}, worse than the GP alone ({gp:.4f})"


def fit_run_tile_effect(
    model: Any,
    gdf: Any,
    target: str,
    *,
    parts: dict[str, tuple[np.ndarray, np.ndarray]],
    noise_kw: dict[str, np.ndarray],
    groups: str = "none",
    seed: int = 0,
) -> Any:
    """Fit the tile effect (:func:`geodbk.tile_effect.fit_tile_effect`) of a trained model.

    Tile ids are the ``quadkey`` column and time steps the quarter indices of ``quarter``
    (all rows one step without it: a constant offset per tile). Validation rows choose the
    parameters, or, when too few of them have a measured tile (tile and block splits), a
    hold-out of the training rows drawn with ``seed`` (:func:`tile_effect_objective`); the
    validation rows then condition the offsets with the training rows. ``groups="urban"`` gives
    urban and rural tiles their own ``tau²`` (:func:`geodbk.tile_effect.urban_groups` of the
    ``urban`` column).
    """

    tiles = split_tests(gdf, target, column="quadkey")
    if "quarter" in gdf.columns:
        quarter = split_tests(gdf, target, column="quarter")
        times = {k: quarter_indices(v).astype(np.float64) for k, v in quarter.items()}
    else:
        times = {k: np.zeros(v.size) for k, v in tiles.items()}
    noise = {k: v for k, v in noise_kw.items() if not k.endswith("_val")}
    noise_val = {k.removesuffix("_val"): v for k, v in noise_kw.items() if k.endswith("_val")}
    group: dict[str, np.ndarray | None] = {"train": None, "val": None}
    if groups == "urban":
        group = {k: urban_groups(v) for k, v in split_tests(gdf, target, column="urban").items()}
    return fit_tile_effect(
        model,
        X=parts["train"][0],
        y=parts["train"][1],
        tiles=tiles["train"],
        times=times["train"],
        X_val=parts["val"][0],
        y_val=parts["val"][1],
        tiles_val=tiles["val"],
        times_val=times["val"],
        noise=noise,
        noise_val=noise_val,
        groups=group["train"],
        groups_val=group["val"],
        seed=seed,
        fewer_tests_lower=target_info(target).higher_is_better,
    )


def resolve_tile_effect_groups(
    cfg: TrainConfig, gdf: Any, target: str, *, source: Path | str = "tiles.parquet"
) -> TrainConfig:
    """Resolve ``tile_effect_groups: auto`` and check an explicit ``urban``.

    Each class's ``tau²`` is chosen on its rows among the tile effect's objective rows
    (:func:`tile_effect_objective`: the validation rows, or the training hold-out on tile and
    block splits). ``auto`` becomes ``urban`` when the table has an ``urban`` column and each
    class has at least :data:`MIN_GROUP_VAL_ROWS` of them, else ``none``. ``urban`` without
    the column, or with a class that has no objective rows, raises :class:`DataError`.
    """
    if cfg.tile_effect_groups == "none":
        return cfg
    if "urban" not in gdf.columns:
        if cfg.tile_effect_groups == "urban":
            raise DataError(
                f"--tile-effect-groups urban needs an 'urban' column in {source}; re-run "
                "`geodbk ingest` with census layers, or use --tile-effect-groups none"
            )
        return cfg.replace(tile_effect_groups="none")
    urban = split_tests(gdf, target, column="urban")
    kind, mask = "validation", np.ones(urban["val"].size, dtype=bool)
    if "quadkey" in gdf.columns:
        kind, mask = tile_effect_objective(gdf, target, seed=cfg.seed)
    per_class = smaller_class_rows(urban["val" if kind == "validation" else "train"][mask])
    if cfg.tile_effect_groups == "auto":
        chosen = "urban" if per_class >= MIN_GROUP_VAL_ROWS else "none"
        log.info(
            "tile effect groups: %s (%d %s rows in the smaller class)", chosen, per_class, kind
        )
        return cfg.replace(tile_effect_groups=chosen)
    if per_class == 0:
        raise DataError(
            f"--tile-effect-groups urban: one urban/rural class has no {kind} rows in "
            f"{source}, so its tau² cannot be chosen; use --tile-effect-groups none"
        )
    return cfg


def choose_time_extrapolation(
    model: Any,
    X_val: np.ndarray,
    y_val: np.ndarray,
    *,
    tests_val: np.ndarray | None = None,
    devices_val: np.ndarray | None = None,
    urban_val: np.ndarray | None = None,
) -> dict[str, Any]:
    """Pick what a time-aware model does outside its training quarters, by validation NLL.

    When some validation rows lie outside the training range (|t| > 1, e.g. the validation
    quarter of a forecast split), the validation NLL of ``hold`` (t clipped to [-1, 1]: the last
    trained quarter's map persists) and of ``trend`` (t as is: the backbone extrapolates) are
    compared and the lower wins. Otherwise there is no evidence either way and ``hold`` is
    chosen (it never invents a trend beyond the data). Returns ``{"policy", "val_nll",
    "val_rows_outside"}`` for the bundle metadata (``time_extrapolation``).
    """

    outside = int((np.abs(X_val[:, 2]) > 1.0).sum()) if len(y_val) else 0
    if outside == 0:
        return {"policy": "hold", "val_nll": None, "val_rows_outside": 0}
    kw = noise_kwargs(model, tests_val, devices_val, urban=urban_val)
    scores: dict[str, float] = {}
    for policy in ("hold", "trend"):
        X = X_val.copy()
        if policy == "hold":
            X[:, 2] = np.clip(X[:, 2], -1.0, 1.0)
        pred = model.predict_dist(X, **kw)
        scores[policy] = float(gaussian_nll(y_val, pred.mean, pred.var))
    best = min(scores, key=lambda k: scores[k])
    return {"policy": best, "val_nll": scores, "val_rows_outside": outside}


def validation_rows_of_run(
    gdf: Any,
    target: str,
    *,
    parts: dict[str, tuple[np.ndarray, np.ndarray]],
    noise_kw: dict[str, np.ndarray],
    cfg: TrainConfig,
    split: dict[str, Any] | None = None,
) -> ValidationRows:
    """The validation rows the post-fit steps read (:class:`pipelines.layers.ValidationRows`):
    tiles, quarters, noise covariates and groups read like the tile effect's, and each row's
    tests and urban class for the place share (tables have both), and its held-out unit
    under the table's ``split`` metadata (:func:`geodbk.geo.blocks.held_out_units`)."""

    tiles = split_tests(gdf, target, column="quadkey")["val"]
    times = (
        quarter_indices(split_tests(gdf, target, column="quarter")["val"]).astype(np.float64)
        if "quarter" in gdf.columns
        else np.zeros(tiles.size)
    )
    urban = split_tests(gdf, target, column="urban")["val"] if "urban" in gdf.columns else None
    units = None
    if {"lon", "lat"} <= set(gdf.columns):
        lon, lat = (split_tests(gdf, target, column=c)["val"] for c in ("lon", "lat"))
        units = held_out_units(lon, lat, split)
    return ValidationRows(
        X=parts["val"][0],
        y=parts["val"][1],
        tiles=tiles,
        times=times,
        noise={k.removesuffix("_val"): v for k, v in noise_kw.items() if k.endswith("_val")},
        groups=urban_groups(urban) if cfg.tile_effect_groups == "urban" else None,
        tests=split_tests(gdf, target)["val"] if "tests" in gdf.columns else None,
        urban=urban,
        units=units,
    )
