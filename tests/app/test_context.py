"""The sidebar's run selection (app/context.py): the default run, no runs at all, a path outside
the runs folder, a missing run; and the RunContext the tabs read."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from apptest_helpers import AppFactory, assert_clean, texts

from app.context import RunContext
from app.runs import inventory


def test_no_run_given_opens_demo_by_default(
    make_app: AppFactory, tiny_run: Path, tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(tiny_run, root / "demo", ignore=shutil.ignore_patterns("checkpoints", "*.tif"))
    (root / "other").mkdir()
    at = make_app(root)
    at.run()
    assert_clean(at)
    assert at.sidebar.selectbox(key="run").value == "demo"
    assert at.sidebar.selectbox(key="run").options == ["demo", "other"]


def test_no_runs_at_all_tells_the_one_command(make_app: AppFactory, tmp_path: Path) -> None:
    at = make_app(tmp_path / "nothing-here")
    at.run()
    assert not at.exception
    info = " ".join(texts(at, "info"))
    assert "make demo" in info and "geodbk demo --run runs/demo" in info


def test_typed_path_outside_the_runs_folder_is_refused(
    make_app: AppFactory, synthetic_root: Path
) -> None:
    at = make_app(synthetic_root, "synth")
    at.run()
    for bad in ("../../etc", "/etc", str(synthetic_root.parent)):
        at.sidebar.text_input(key="run_path").input(bad).run()
        assert not at.exception
        assert any("not inside the runs folder" in e for e in texts(at, "error")), bad
        assert not at.tabs
    at.sidebar.text_input(key="run_path").input("synth").run()
    assert_clean(at)
    assert at.tabs


def test_missing_run_directory(make_app: AppFactory, synthetic_root: Path) -> None:
    at = make_app(synthetic_root, "synth")
    at.run()
    at.sidebar.text_input(key="run_path").input("does-not-exist").run()
    assert not at.exception
    assert any("does not exist" in e for e in texts(at, "error"))
    assert any("geodbk demo --run" in i for i in texts(at, "info"))


def test_the_run_context_reads_the_model_and_the_tile_table(tmp_path: Path) -> None:
    run = tmp_path / "timed"
    model_dir = run / "models" / "upload"
    model_dir.mkdir(parents=True)
    metadata = {
        "inputs": ["x1", "x2", "t"],
        "quarters": ["2023Q2", "2023Q1"],
        "time_scaling": {"first": "2023Q1", "last": "2023Q3"},
        "tiles_metadata": {"ingest_id": "first"},
    }
    (model_dir / "model.json").write_text(json.dumps({"metadata": metadata}))
    doc = {"ingest_id": "second", "quarters": ["2023Q3", "2023Q1"]}
    table = pa.table({"x1": [0.0]}).replace_schema_metadata({b"geodbk": json.dumps(doc)})
    pq.write_table(table, run / "tiles.parquet")
    ctx = RunContext(run, inventory(run), "upload", show_region=False, show_urban=False)
    assert ctx.unit == "Mbps" and ctx.cmd("train").endswith("--target upload")
    assert ctx.model_metadata() == metadata and ctx.time_aware()
    assert ctx.model_quarter_options() == ["2023Q1", "2023Q2", "2023Q3"]
    assert ctx.current_quarter() == "2023Q3"  # no grid: the model's latest quarter
    assert ctx.pooled_label() == "pooled 2023Q1:2023Q3"
    stale = ctx.stale_model()
    assert stale is not None and "earlier ingest" in stale and ctx.cmd("train") in stale
    other = RunContext(run, inventory(run), "latency", show_region=False, show_urban=False)
    assert other.unit == "ms" and other.model_metadata() == {} and not other.time_aware()
    assert other.stale_model() is None and other.region() is None
