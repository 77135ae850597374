"""The typed training configuration: defaults, YAML loading with validation, CLI overrides.

Precedence: built-in defaults (the seed's Ookla settings) < the YAML file (``--config``) < CLI
flags (``--epochs``, ``--device``). The resolved configuration is saved next to the model as
``config.yaml`` and its hash goes into every provenance record.

Example file (every key optional)::

    rank: 512
    hidden: 128
    epochs: 100
    patience: 20
    device: cpu
    time: true        # time-aware model: inputs [x1, x2, t] (geodbk train --time)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from geodbk.errors import DataError
from geodbk.hyperparameters import DBKHyperparameters

_EXPANSIONS = ("rbf", "silu")
_OBJECTIVES = ("dppgp", "ppgp", "elbo", "exact")
_DEVICES = ("auto", "cpu", "cuda")
_NOISES = ("auto", "tests", "tests+devices", "tests+urban", "tests+devices+urban", "constant")
_TILE_EFFECTS = ("auto", "on", "off")
_TILE_EFFECT_GROUPS = ("auto", "urban", "none")
#: Noise models a fitted estimator can have (``auto`` resolved away).
NOISE_MODELS = tuple(n for n in _NOISES if n != "auto")
#: Suffix of the noise models with a floor per urban/rural class (estimator ``noise_urban``).
URBAN_SUFFIX = "+urban"


@dataclass(kw_only=True)
class TrainConfig(DBKHyperparameters):
    """Hyperparameters of ``geodbk train`` (passed to :class:`geodbk.DBKRegressor`).

    The model and training keys, and their defaults, are those of
    :class:`geodbk.hyperparameters.DBKHyperparameters` (the estimator's): the seed's settings
    for Ookla data, DBK-RBF trained with dPPGP, h=256, r=1024, α=0.1, β=0.01, batch 1024, AdamW
    lr 1e-3 with weight decay 1e-2 on the backbone only, 400 epochs, best epoch by validation
    NLL, early stopping after ``patience`` epochs. Declared here are only ``noise`` and
    ``noise_init`` (their defaults ``auto`` and ``0`` are resolved from the tile table) and the
    pipeline keys. A value: change it with :meth:`replace` (a new config), not by assignment.

    Attributes
    ----------
    expansion, objective
        Basis (``rbf``/``silu``) and training objective (``dppgp``/``ppgp``/``elbo``/``exact``).
    rank, hidden
        Basis rank r and backbone width h.
    alpha, beta
        dPPGP trace and KL weights.
    batch_size, epochs, lr, weight_decay, patience
        Optimiser settings.
    device
        ``auto``, ``cpu`` or ``cuda``.
    seed
        Random seed (initialisation and batch order).
    kernel_update_every
        DBK-RBF: the inducing points and kernel take a step every this many mini-batches
        (held, with Kzz's Cholesky factor reused, in between); 1: every batch; 0 (default): 4
        with the RBF basis and dPPGP (the same test NLL on Hawaii, a quarter less time per
        step: docs/decisions/defaults.md), else 1.
    predict_chunk_size
        Rows per prediction chunk (bounds memory in predict and report).
    noise
        Observation noise: ``tests`` (per tile ``s2_i = s2_floor + s2_meas / tests_i``),
        ``tests+devices`` (``s2_i = s2_floor + s2_meas / tests_i + s2_dev / devices_i``; needs
        the ``tests`` and ``devices`` columns), ``tests+urban`` / ``tests+devices+urban`` (those
        with a floor per urban/rural class, ``s2_floor(urban_i)``; needs both classes in the
        train split; opt-in: it did not change cross-validated NLL on Hawaii,
        docs/decisions/noise_model.md), ``constant`` (one ``s2``) or ``auto``, resolved by
        ``geodbk train`` before the config is saved: ``tests+devices`` when the tile table has
        ``tests`` and ``devices`` columns and the model trains in memory (validation NLL
        favoured it on every Hawaii target), ``tests`` under
        ``--streaming``/``--distributed`` or without ``devices``, ``constant`` without
        ``tests``. The ``devices`` and ``urban`` terms are not supported with ``streaming`` or
        ``--distributed``.
    noise_power
        With ``noise: tests`` (``tests+devices``), learn the exponent ``p`` in
        ``s2_meas / tests_i^p`` (and ``q`` in ``s2_dev / devices_i^q``).
    noise_init
        Initial noise variance in standardised units (of a single test for ``noise: tests``);
        ``0`` (default) picks the noise model's default: 0.01 for ``constant`` (the seed's) and
        0.5 for ``tests`` and ``tests+devices`` (measured on Hawaii: from 0.01 the per-tile noise barely moves within
        a CPU budget while var_f absorbs the residual variance; docs/decisions/noise_model.md).
    time
        Time-aware model (``geodbk train --time``): the inputs are ``[x1, x2, t]`` with
        ``t = 2 (i - i_first) / (i_last - i_first) - 1`` the tile's quarter index ``i`` scaled
        over the train split's quarter range (:class:`geodbk.geo.timeaxis.TimeScaling`), so
        one model maps any quarter and the change between quarters. ``False`` (default): the
        pooled model, inputs ``[x1, x2]`` with every quarter's tiles pooled.
    streaming
        Out-of-core training (``geodbk train --streaming``): the train split is read from
        ``tiles.parquet`` a shuffle window of row groups at a time
        (:func:`geodbk.geo.parquet_batches.fit_parquet`), so memory does not grow with n; the
        validation split is held in memory. Mini-batch objectives only.
    tile_effect
        A persistent per-tile offset (``geodbk train --tile-effect``,
        :mod:`geodbk.tile_effect`): after the GP is trained, each tile's residuals in its other
        quarters shift its prediction, through an AR(1) offset over quarters whose variance,
        correlation and the refitted noise are chosen by validation NLL. It gives the ``tile``
        quantity of maps, ``--at`` predictions and the report (:mod:`geodbk.quantities`). ``on``,
        ``off`` (YAML ``true``/``false`` also work) or ``auto`` (default), resolved by
        ``geodbk train`` before the config is saved: ``on`` when training is in memory and the
        table has ``quadkey``, at least 2 quarters and a validation split (cross-validated on
        Hawaii it lowered NLL by 0.1-0.2 and put every tests bucket, urban and rural, inside
        95 ± 2%: docs/decisions/tile_effect.md), else ``off``. ``on`` is refused with
        ``streaming`` and ``--distributed``.
    tile_effect_groups
        Groups of tiles with their own offset variance ``tau²`` (``geodbk train
        --tile-effect-groups``): ``urban`` (urban and rural tiles, from the ``urban`` column),
        ``none`` (one ``tau²``) or ``auto`` (default): ``urban`` when the table has ``urban``
        and each class has at least 100 validation rows, else ``none`` (cross-validated on
        Hawaii: every urban/rural cell inside 95 ± 2% in four of four runs, against two of
        four with one ``tau²``; docs/decisions/tile_effect.md). Resolved by ``geodbk train``
        when the tile effect is on.
    local_layer
        A short-range spatial field over tile offsets on top of the tile effect
        (:mod:`geodbk.local_layer`): a tile is pulled toward its measured neighbours (k-d
        tree, ``local_layer_neighbours`` nearest tiles), with the field's share of the offset
        variance and its range chosen by validation NLL. ``auto`` (default) = ``on`` whenever
        the tile effect is; ``off`` keeps the tile effect alone (measured on Hawaii:
        docs/decisions/local_layer.md).
    local_layer_neighbours
        The measured tiles that krige the field at a place (default 8, at least 1): on seven
        Hawaii runs the test NLL at 8 is within 0.003 of that at 16 to 48, and a tile map's
        layer takes 0.6 times the time of 16 (docs/decisions/local_layer.md, "How many neighbours").
        Saved in the layer's ``local_layer.json``; maps use the number the layer was fitted
        with.
    """

    noise: str = "auto"
    noise_init: float = 0.0
    predict_chunk_size: int = 65536
    time: bool = False
    streaming: bool = False
    tile_effect: str = "auto"
    tile_effect_groups: str = "auto"
    local_layer: str = "auto"
    local_layer_neighbours: int = 8  # geodbk.local_layer.NEIGHBOURS (this module stays light)

    def __post_init__(self) -> None:
        for key in ("tile_effect", "local_layer"):  # YAML true / false
            value = getattr(self, key)
            if isinstance(value, bool):
                setattr(self, key, "on" if value else "off")
        self.validate(source="config")

    def validate(self, *, source: str) -> None:
        """Check types and ranges; raise :class:`DataError` naming ``source`` and the key."""
        for f in fields(self):
            value = getattr(self, f.name)
            want = _FIELD_TYPES[f.name]
            ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise DataError(
                    f"{source}: key {f.name!r} must be {want.__name__}, "
                    f"got {type(value).__name__} {value!r}"
                )
        for f in fields(self):
            value = getattr(self, f.name)
            if _FIELD_TYPES[f.name] is float and not math.isfinite(float(value)):
                raise DataError(f"{source}: key {f.name!r} must be a finite number, got {value!r}")
        checks: list[tuple[str, bool, str]] = [
            ("expansion", self.expansion in _EXPANSIONS, f"one of {_EXPANSIONS}"),
            ("objective", self.objective in _OBJECTIVES, f"one of {_OBJECTIVES}"),
            ("device", self.device in _DEVICES, f"one of {_DEVICES}"),
            ("noise", self.noise in _NOISES, f"one of {_NOISES}"),
            *((name, False, rule) for name, rule in self.out_of_range()),
            (
                "kernel_update_every",
                self.kernel_update_every_allowed(),
                "0 (default) or 1 with expansion 'silu' (no kernel to hold) or objective "
                "'exact' (one full-batch step per epoch)",
            ),
            ("predict_chunk_size", self.predict_chunk_size >= 1, ">= 1"),
            ("local_layer_neighbours", self.local_layer_neighbours >= 1, ">= 1"),
            (
                "streaming",
                not (self.streaming and self.objective == "exact"),
                "false with objective 'exact' (it needs the whole train split in memory)",
            ),
            (
                "streaming",
                not (self.streaming and self.noise.startswith("tests+")),
                f"false with noise {self.noise!r} (not supported out of core yet; use "
                "noise 'tests' or train in memory)",
            ),
            ("tile_effect", self.tile_effect in _TILE_EFFECTS, f"one of {_TILE_EFFECTS}"),
            ("local_layer", self.local_layer in _TILE_EFFECTS, f"one of {_TILE_EFFECTS}"),
            (
                "tile_effect_groups",
                self.tile_effect_groups in _TILE_EFFECT_GROUPS,
                f"one of {_TILE_EFFECT_GROUPS}",
            ),
            (
                "streaming",
                not (self.streaming and self.tile_effect == "on"),
                "false with tile_effect 'on' (the tile effect needs the train split in memory)",
            ),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise DataError(f"{source}: key {key!r} must be {rule}, got {getattr(self, key)!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (for YAML, JSON and hashing)."""
        return dataclasses.asdict(self)

    def estimator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`geodbk.DBKRegressor` (everything but pipeline keys).

        An unresolved ``noise: auto`` is passed as ``constant`` (``geodbk train`` resolves it
        from the tile table first); ``noise_init: 0`` becomes :data:`NOISE_INIT` of the noise;
        a noise ending in ``+urban`` is passed as the noise without it and ``noise_urban=True``.
        ``time``, ``streaming`` and ``tile_effect(_groups)`` are pipeline options, not
        estimator ones.
        """
        d = {f.name: getattr(self, f.name) for f in fields(DBKHyperparameters)}
        if d["noise"] == "auto":
            d["noise"] = "constant"
        if d["noise_init"] == 0:
            d["noise_init"] = NOISE_INIT[d["noise"]]
        d["noise_urban"] = d["noise"].endswith(URBAN_SUFFIX)
        d["noise"] = d["noise"].removesuffix(URBAN_SUFFIX)
        return d

    def replace(self, **changes: Any) -> TrainConfig:
        """Return a copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


#: The type of each key (its annotation).
_FIELD_TYPES: dict[str, type] = get_type_hints(TrainConfig)

#: Initial noise variance (standardised units) per noise model when ``noise_init`` is 0.
NOISE_INIT = {
    "constant": DBKHyperparameters.noise_init,  # the estimator's (the seed's)
    "tests": 0.5,
    "tests+devices": 0.5,
    "tests+urban": 0.5,
    "tests+devices+urban": 0.5,
}


def check_epochs_flag(epochs: int | None) -> None:
    """Refuse an ``--epochs`` flag below 1, naming the flag (``None``: not given)."""
    if epochs is not None and not epochs >= 1:
        raise DataError(
            f"--epochs must be at least 1 (the most epochs to train; early stopping may end "
            f"sooner), got {epochs}"
        )


def load_config(path: str | Path | None, *, base: TrainConfig | None = None) -> TrainConfig:
    """Load a YAML config file on top of ``base`` (default: :class:`TrainConfig` defaults).

    Parameters
    ----------
    path
        YAML file with a mapping of :class:`TrainConfig` keys; ``None`` returns ``base``.
    base
        Values that keys absent from the file keep.

    Raises
    ------
    DataError
        The file is missing, not YAML, not a mapping, has an unknown key or a value of the
        wrong type or range; the message names the file and the key.
    """
    base = base or TrainConfig()
    if path is None:
        return base
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise DataError(
            f"config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise DataError(f"config file {path} is not valid YAML: {exc}") from exc
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise DataError(f"config file {path} must hold a mapping of keys, got {type(raw).__name__}")
    known = {f.name for f in fields(TrainConfig)}
    for key in raw:
        if key not in known:
            raise DataError(
                f"config file {path}: unknown key {key!r}; known keys: {', '.join(sorted(known))}"
            )
    values = {**base.to_dict(), **{k: _numeric(k, v) for k, v in raw.items()}}
    try:
        return TrainConfig(**values)
    except DataError as exc:
        raise DataError(str(exc).replace("config:", f"config file {path}:", 1)) from None


def _numeric(key: str, value: Any) -> Any:
    """A numeric string for a numeric key read as its number: YAML 1.1 reads ``1e-3`` (no
    dot) as a string. Anything else is returned as it is, for the type check to judge."""
    want = _FIELD_TYPES.get(key)
    if want in (int, float) and isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return value
        if want is int and number.is_integer():
            return int(number)
        return number if want is float else value
    return value


def dump_config(config: TrainConfig) -> str:
    """YAML text of the resolved config (sorted keys)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=True)


def demo_config(*, quick: bool = False) -> TrainConfig:
    """Small-but-real settings used by ``geodbk demo`` (``quick``: tiny variant for tests).

    Demo: r=256, h=64, up to 60 epochs, patience 10, batch 256, lr 3e-3 (on the demo table this
    reached test NLL 0.026 for download against 0.244 with 40 epochs at batch 512 and lr 1e-3,
    whose best epoch was its last). Quick: r=32, h=16, 3 epochs.
    """
    if quick:
        return TrainConfig(rank=32, hidden=16, epochs=3, patience=3, batch_size=256, device="cpu")
    return TrainConfig(
        rank=256, hidden=64, epochs=60, patience=10, batch_size=256, lr=3e-3, device="cpu"
    )
