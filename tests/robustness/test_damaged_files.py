"""Probes of garbage and truncated files in a run and of config files YAML or the user got
wrong: each stage that reads one stops with the documented exit code (3: a data or config file;
4: a model file), a message naming the file and the command that writes it again, no traceback,
and the run unchanged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from probe_helpers import BAD_INPUT, BAD_MODEL, copy_run, probe

REPO = Path(__file__).resolve().parents[2]
COUNTIES = REPO / "data" / "census" / "synthetic_counties.geojson"


@pytest.fixture
def run(tiny_run: Path, tmp_path: Path) -> Path:
    return copy_run(tiny_run, tmp_path / "run")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("places") / "places.csv"
    pd.DataFrame({"lon": [-99.9, -99.8], "lat": [39.5, 39.6]}).to_csv(path, index=False)
    return path


def garbage(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(data)

    write.__name__ = f"garbage {data[:12]!r}"
    return write


def truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


STAGES: dict[str, Callable[[Path, Path], list[str]]] = {
    "train": lambda r, p: ["train", "--run", str(r), "--target", "download", "--epochs", "1"],
    "predict": lambda r, p: ["predict", "--run", str(r), "--target", "download"],
    "predict --at": lambda r, p: [
        "predict",
        "--run",
        str(r),
        "--target",
        "download",
        "--at",
        str(p),
    ],
    "report": lambda r, p: ["report", "--run", str(r), "--target", "download"],
    "service": lambda r, p: ["service", "--run", str(r)],
    "summarize": lambda r, p: [
        "summarize",
        "--run",
        str(r),
        "--target",
        "download",
        "--areas",
        str(COUNTIES),
    ],
    "export": lambda r, p: ["export", "--run", str(r), "--target", "download"],
    "export --quarter": lambda r, p: [
        "export",
        "--run",
        str(r),
        "--target",
        "download",
        "--quarter",
        "2023Q2",
    ],
}

TILE_EFFECT_FIX = ("tile_effect.json", "is missing or unreadable", "geodbk train --run")
TILES_FIX = ("tiles.parquet", "not a readable parquet file", "geodbk ingest")
GRID_FIX = ("grids/download.nc is not a readable grid", "geodbk predict --run")

CASES = [
    # the tile effect saved with a model: every stage that maps or scores with it
    *[
        (stage, "models/download/tile_effect.json", garbage(b"{not json"), BAD_MODEL, TILE_EFFECT_FIX)
        for stage in ("predict", "predict --at", "report", "service", "summarize")
    ],
    ("predict", "models/download/tile_effect.json", garbage(b'{"rho": "x"}'), BAD_MODEL, TILE_EFFECT_FIX),
    ("predict", "models/download/tile_effect_rows.parquet", truncated, BAD_MODEL, TILE_EFFECT_FIX),
    # the model's other files
    ("predict", "models/download/local_layer.json", garbage(b"\x00garbage"), BAD_MODEL, ("local_layer.json", "geodbk train")),
    ("predict", "models/download/model.json", garbage(b"{}"), BAD_MODEL, ("model.json", "not a geodbk model file")),
    ("predict", "models/download/weights.safetensors", truncated, BAD_MODEL, ("weights.safetensors", "retrain")),
    # the tile table, truncated: every stage that reads it
    *[
        (stage, "tiles.parquet", truncated, BAD_INPUT, TILES_FIX)
        for stage in ("train", "predict", "predict --at", "report", "service", "summarize")
    ],
    ("predict", "region.geojson", garbage(b"<html>sign in</html>"), BAD_INPUT, ("region.geojson", "geodbk ingest")),
    # grids read by export and report
    ("export", "grids/download.nc", truncated, BAD_INPUT, GRID_FIX),
    ("export", "grids/download.nc", garbage(b"\x89HDF\r\n\x1a\ngarbage"), BAD_INPUT, GRID_FIX),
    ("export", "grids/download.nc", garbage(b""), BAD_INPUT, GRID_FIX),
    ("export --quarter", "grids/download_2023Q2.nc", truncated, BAD_INPUT, ("download_2023Q2.nc is not a readable grid", "--quarter 2023Q2")),
    ("report", "grids/download.nc", truncated, BAD_INPUT, GRID_FIX),
]  # fmt: skip


@pytest.mark.parametrize(
    ("stage", "name", "damage", "code", "names"),
    CASES,
    ids=[f"{c[0]} {c[1]} {c[2].__name__}" for c in CASES],
)
def test_a_damaged_file_is_named_with_its_fix(
    run: Path,
    places: Path,
    stage: str,
    name: str,
    damage: Callable[[Path], None],
    code: int,
    names: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    damage(run / name)
    probe(STAGES[stage](run, places), run=run, code=code, names=names, capsys=capsys)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (
            "lr: 0.001  # caf\u00e9\n".encode("latin-1"),
            ("cfg.yaml is not UTF-8 text", "save it as UTF-8"),
        ),
        (b"alpha: .inf\n", ("cfg.yaml: key 'alpha' must be a finite number",)),
        (b"lr: .nan\n", ("cfg.yaml: key 'lr' must be a finite number",)),
        (b"rank: 0\n", ("cfg.yaml: key 'rank' must be >= 1",)),
        (b"epochs: ten\n", ("cfg.yaml: key 'epochs' must be int",)),
        (b"[1, 2\n", ("cfg.yaml is not valid YAML",)),
        (b"speed: 3\n", ("cfg.yaml: unknown key 'speed'", "known keys")),
    ],
    ids=["latin-1", "alpha .inf", "lr .nan", "rank 0", "epochs text", "broken YAML", "unknown key"],
)
def test_a_bad_config_file_is_named_with_the_key(
    run: Path,
    tmp_path: Path,
    text: bytes,
    names: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_bytes(text)
    argv = ["train", "--run", str(run), "--target", "download", "--config", str(cfg)]
    probe(argv, run=run, code=BAD_INPUT, names=names, capsys=capsys)


def test_a_truncated_checkpoint_is_named_on_resume(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = run / "models" / "download" / "checkpoints"
    truncated(ckpt / "last.pt")
    argv = [
        "train", "--run", str(run), "--target", "download", "--resume",
        "--config", str(ckpt / "config.yaml"),
    ]  # fmt: skip
    names = (f"cannot read the training checkpoint {ckpt / 'last.pt'}", "Delete it to start afresh")
    probe(argv, run=run, code=BAD_MODEL, names=names, capsys=capsys)


def test_lr_1e_3_in_yaml_trains(run: Path, tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e-3`` as a string: a numeric key takes it as its number."""
    from pipelines import cli
    from pipelines.config import load_config

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("lr: 1e-3\nepochs: 1\n")
    argv = ["train", "--run", str(run), "--target", "upload", "--config", str(cfg)]
    assert cli.main([*argv, "--no-progress"]) == 0
    assert load_config(run / "models" / "upload" / "config.yaml").lr == 1e-3
