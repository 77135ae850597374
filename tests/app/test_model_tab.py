"""The Model tab: the training history (history.csv, else model.json), the run's numbers, and
the command named when the target has no model."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from app.context import RunContext
from app.runs import inventory
from app.tabs.model_tab import history_frame


def _context(run: Path, target: str = "download") -> RunContext:
    return RunContext(run, inventory(run), target, show_region=False, show_urban=False)


def _model(run: Path, **doc: object) -> Path:
    folder = run / "models" / "download"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.json").write_text(json.dumps(doc))
    return folder


def test_history_comes_from_the_csv_else_the_bundle(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    history = [{"epoch": 1, "train_loss": 2.0}, {"epoch": 2, "train_loss": 1.5}]
    folder = _model(tmp_path, history=history)
    frame = history_frame(ctx, ctx.model_json())
    assert frame is not None and frame["train_loss"].tolist() == [2.0, 1.5]
    (folder / "history.csv").write_text("epoch,train_loss,val_nll\n1,3.0,0.9\n")
    frame = history_frame(ctx, ctx.model_json())
    assert frame is not None and frame["val_nll"].tolist() == [0.9]
    (folder / "history.csv").write_text("step,loss\n1,3.0\n")  # no epoch column: no curve
    assert history_frame(ctx, ctx.model_json()) is None
    assert history_frame(ctx, {"metadata": {"history": []}}) is None


def _render(run: str, target: str) -> None:
    from pathlib import Path

    from app.context import RunContext
    from app.runs import inventory
    from app.tabs.model_tab import render

    path = Path(run)
    render(RunContext(path, inventory(path), target, show_region=False, show_urban=False))


def test_the_tab_shows_the_run_s_numbers_and_names_the_train_command(tmp_path: Path) -> None:
    timings = {"epochs_run": 7, "fit_seconds": 12.34, "seconds_per_epoch": 1.7634}
    metadata = {"timings": timings, "n_train": 12345, "n_val": 99, "best_epoch": 5}
    _model(tmp_path, metadata=metadata, history=[{"epoch": 1, "train_loss": 2.0}])
    (tmp_path / "demo_timings.json").write_text(json.dumps({"seconds": {"train_download": 3.5}}))
    at = AppTest.from_function(_render, args=(str(tmp_path), "download"), default_timeout=30)
    at.run()
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Epochs run"] == "7" and metrics["Best epoch (val NLL)"] == "5"
    assert metrics["Training time"] == "12.3 s" and metrics["Per epoch"] == "1.76 s"
    assert metrics["Training rows"] == "12,345" and metrics["Validation rows"] == "99"
    assert at.dataframe[0].value["stage"].tolist() == ["train download"]
    at = AppTest.from_function(_render, args=(str(tmp_path), "upload"), default_timeout=30)
    at.run()
    info = " ".join(str(i.value) for i in at.info)
    assert "no trained upload model" in info and "geodbk train --run" in info


def test_pipeline_timings_follow_the_demo_s_stage_order() -> None:
    """``demo_timings.json`` lists its stages alphabetically (``total`` among them); the table
    reads in the order the demo runs them, targets as in the sidebar, the total last."""
    from app.tabs.model_tab import timings_frame

    secs = {
        "export": 3.4,
        "ingest": 0.6,
        "predict_download": 4.6,
        "predict_latency": 3.5,
        "report_upload": 2.6,
        "service": 11.1,
        "summarize_download": 2.8,
        "total": 100.7,
        "train_download": 15.2,
        "train_upload": 22.9,
        "trend_download": 0.3,
        "zeta": 1.0,
        "flag": True,
    }
    frame = timings_frame(secs)
    assert list(frame["stage"]) == [
        "ingest",
        "train download",
        "train upload",
        "predict download",
        "predict latency",
        "trend download",
        "export",
        "service",
        "summarize download",
        "report upload",
        "zeta",
        "total",
    ]
    assert frame["seconds"].iloc[-1] == 100.7
    assert list(timings_frame({}).columns) == ["stage", "seconds"]
