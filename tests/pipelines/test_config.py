"""The typed training config: defaults, YAML validation, precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from geodbk.errors import DataError
from pipelines.config import TrainConfig, demo_config, dump_config, load_config
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
