"""The typed training config: defaults, YAML validation, precedence."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.hyperparameters import DBKHyperparameters
from pipelines.config import NOISE_INIT, TrainConfig, demo_config, dump_config, load_config
from pipelines.train import resolve_config


def test_defaults_are_the_seed_ookla_settings() -> None:
    c = TrainConfig()
    assert (c.expansion, c.objective, c.hidden, c.rank) == ("rbf", "dppgp", 256, 1024)
    assert (c.alpha, c.beta, c.batch_size, c.lr, c.weight_decay, c.epochs) == (
        0.1,
        0.01,
        1024,
        1e-3,
        1e-2,
        400,
    )


#: The YAML keys of ``config.yaml`` (older runs read and compare them on ``--resume``).
CONFIG_KEYS = (
    "alpha batch_size beta device epochs expansion hidden kernel_update_every local_layer "
    "local_layer_neighbours lr "
    "noise noise_init "
    "noise_power objective patience predict_chunk_size rank seed streaming tile_effect "
    "tile_effect_groups time weight_decay"
).split()


def test_model_keys_take_the_estimators_defaults() -> None:
    """One declaration (DBKHyperparameters): every model key but the two resolved from the
    tile table has the estimator's default, and the config passes the estimator its keys."""
    c, est = TrainConfig(), DBKRegressor()
    shared = {f.name for f in fields(DBKHyperparameters)}
    differ = {k for k in shared if getattr(c, k) != getattr(est, k)}
    assert differ == {"noise", "noise_init"}
    assert (c.noise, c.noise_init, NOISE_INIT["constant"]) == ("auto", 0.0, est.noise_init)
    kwargs = c.replace(noise="tests+urban", rank=8).estimator_kwargs()
    assert set(kwargs) == shared | {"noise_urban"}
    assert (kwargs["noise"], kwargs["noise_urban"], kwargs["noise_init"], kwargs["rank"]) == (
        "tests",
        True,
        0.5,
        8,
    )
    assert DBKRegressor(**kwargs).get_params()["rank"] == 8


def test_the_yaml_keys_and_their_order_are_those_of_older_runs(tmp_path: Path) -> None:
    text = dump_config(TrainConfig())
    assert [line.split(":")[0] for line in text.splitlines()] == CONFIG_KEYS
    assert "noise: auto\nnoise_init: 0.0\n" in text
    c = TrainConfig(tile_effect=True, local_layer=False)  # type: ignore[arg-type]
    assert (c.tile_effect, c.local_layer) == ("on", "off")  # YAML booleans
    assert c.replace(rank=8) == TrainConfig(rank=8, tile_effect="on", local_layer="off")
    assert c.replace(rank=8) is not c and c.rank == 1024


def test_the_layers_neighbours_default_is_the_layers_own() -> None:
    """The config keeps its own copy of the default (it imports no torch): the same number."""
    from geodbk.local_layer import NEIGHBOURS

    assert TrainConfig().local_layer_neighbours == NEIGHBOURS


def test_file_overrides_defaults_and_flags_override_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("rank: 64\nepochs: 7\nlr: 1\n")
    c = resolve_config(config_path=f, epochs=3, device="cpu")
    assert (c.rank, c.epochs, c.device, c.lr, c.hidden) == (64, 3, "cpu", 1.0, 256)
    assert isinstance(c.lr, float | int)


def test_roundtrip_of_resolved_config(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(dump_config(demo_config()))
    assert load_config(f) == demo_config()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rnak: 3\n", "unknown key 'rnak'"),
        ("rank: big\n", "key 'rank' must be int"),
        ("rank: 2.5\n", "key 'rank' must be int"),
        ("alpha: [1]\n", "key 'alpha' must be float"),
        ("epochs: true\n", "key 'epochs' must be int"),
        ("device: tpu\n", "key 'device' must be one of"),
        ("rank: 0\n", "key 'rank' must be >= 1"),
        ("local_layer_neighbours: 0\n", "key 'local_layer_neighbours' must be >= 1"),
        ("kernel_update_every: -1\n", "key 'kernel_update_every' must be >= 0"),
        ("kernel_update_every: 2\nexpansion: silu\n", "'kernel_update_every' must be 0 (default)"),
        ("kernel_update_every: 2\nobjective: exact\n", "'kernel_update_every' must be 0 (default)"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("rank: [\n", "not valid YAML"),
    ],
)
def test_bad_files_name_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(DataError) as info:
        load_config(f)
    assert needle in str(info.value)
    assert str(f) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_empty_file_keeps_defaults(tmp_path: Path) -> None:
    f = tmp_path / "empty.yaml"
    f.write_text("")
    assert load_config(f) == TrainConfig()
