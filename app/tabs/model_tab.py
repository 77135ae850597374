"""Model tab: training history, configuration and timings (read from the bundle's files)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from app import loaders
from app.context import RunContext
from app.runs import TARGETS
from app.ui import missing


def history_frame(ctx: RunContext, doc: dict[str, Any]) -> pd.DataFrame | None:
    """Training history from ``history.csv`` (else the ``history`` list in ``model.json``)."""
    path = ctx.files.model_dir / "history.csv"
    frame: pd.DataFrame | None
    if path.is_file():
        frame = loaders.load_csv(str(path), loaders.stamp(path))
    else:
        hist = doc.get("history") or doc.get("metadata", {}).get("history")
        frame = pd.DataFrame(hist) if isinstance(hist, list) and hist else None
    if frame is None or "epoch" not in frame.columns:
        return None
    return frame


def _curve(frame: pd.DataFrame, column: str, title: str, axis_title: str, best: int | None) -> Any:
    data = frame[["epoch", column]].dropna()
    values = data[column].to_numpy(dtype=float)
    # A log axis when a positive curve spans more than a factor 5 (a steep first epoch).
    log = bool(len(values) and values.min() > 0 and values.max() / values.min() > 5)
    scale = alt.Scale(type="log", nice=False) if log else alt.Scale(zero=False)
    line = (
        alt.Chart(data)
        .mark_line(color="#31688e")
        .encode(
            x=alt.X("epoch:Q", title="epoch", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y(f"{column}:Q", title=axis_title + (", log axis" if log else ""), scale=scale),
            tooltip=["epoch", alt.Tooltip(f"{column}:Q", format=".4f")],
        )
    )
    layers: list[Any] = [line]
    if best is not None:
        layers.append(
            alt.Chart(pd.DataFrame({"epoch": [best]}))
            .mark_rule(color="#b5367a", strokeDash=[4, 3])
            .encode(x="epoch:Q")
        )
    return alt.layer(*layers).properties(height=260, title=title)


def render(ctx: RunContext) -> None:
    """Render the model tab."""
    if not ctx.files.has_model:
        missing(f"This run has no trained {ctx.target} model.", ctx.cmd("train"))
        return
    doc = ctx.model_json()
    raw_md = doc.get("metadata")
    md: dict[str, Any] = raw_md if isinstance(raw_md, dict) else {}
    raw_t = md.get("timings")
    timings: dict[str, Any] = raw_t if isinstance(raw_t, dict) else {}
    best = doc.get("best_epoch", md.get("best_epoch"))
    best = int(best) if isinstance(best, int | float) else None
    frame = history_frame(ctx, doc)

    c = st.columns(6)
    epochs = timings.get("epochs_run", len(frame) if frame is not None else None)
    c[0].metric("Epochs run", f"{epochs}" if epochs is not None else "–")
    c[1].metric("Best epoch (val NLL)", f"{best}" if best is not None else "–")
    fit = timings.get("fit_seconds")
    c[2].metric("Training time", f"{fit:.1f} s" if isinstance(fit, int | float) else "–")
    per = timings.get("seconds_per_epoch")
    c[3].metric("Per epoch", f"{per:.2f} s" if isinstance(per, int | float) else "–")
    n_train, n_val = md.get("n_train"), md.get("n_val")
    c[4].metric("Training rows", f"{n_train:,}" if isinstance(n_train, int) else "–")
    c[5].metric("Validation rows", f"{n_val:,}" if isinstance(n_val, int) else "–")

    if frame is not None:
        left, right = st.columns(2)
        if "train_loss" in frame:
            left.altair_chart(
                _curve(frame, "train_loss", "Training loss (dPPGP)", "loss", best), width="stretch"
            )
        if "val_nll" in frame and frame["val_nll"].notna().any():
            right.altair_chart(
                _curve(frame, "val_nll", "Validation NLL", "NLL", best), width="stretch"
            )
        st.caption("Dashed line: the best epoch by validation NLL, whose weights were kept.")
    else:
        st.info("No training history recorded in this bundle.")

    cfg_path = ctx.files.model_dir / "config.yaml"
    left, right = st.columns(2)
    with left:
        st.markdown("**Configuration** (`config.yaml`)")
        if cfg_path.is_file():
            st.code(loaders.load_text(str(cfg_path), loaders.stamp(cfg_path)), language="yaml")
        elif isinstance(doc.get("config"), dict):
            st.json(doc["config"], expanded=False)
    with right:
        st.markdown("**Provenance**")
        inputs = md.get("inputs")
        ts = md.get("time_scaling")
        prov = {
            "inputs": ", ".join(map(str, inputs)) if isinstance(inputs, list) else None,
            "time scaling (training quarters)": (
                f"{ts.get('first')}–{ts.get('last')}; later quarters are extrapolations"
                if isinstance(ts, dict)
                else None
            ),
            "target transform": md.get("target_transform"),
            "created": md.get("created"),
            "geodbk version": md.get("geodbk_version"),
            "config hash": md.get("config_hash"),
            "estimator": doc.get("config"),
        }
        est = prov.pop("estimator", None)
        st.markdown("\n".join(f"- **{k}**: `{v}`" for k, v in prov.items() if v is not None))
        if isinstance(est, dict):
            st.markdown(
                "- **estimator**: "
                + ", ".join(f"{k}={v}" for k, v in est.items() if k not in ("device", "dtype"))
            )
        ing = ctx.inv.ingest_report
        if ing.is_file():
            st.markdown("**Ingest report** (`ingest_report.json`)")
            st.json(loaders.load_json(str(ing), loaders.stamp(ing)), expanded=1)
    _pipeline_timings(ctx)


def _pipeline_timings(ctx: RunContext) -> None:
    """Per-stage seconds of the demo pipeline (``demo_timings.json``), when the run has them."""
    path = ctx.inv.path / "demo_timings.json"
    if not path.is_file():
        return
    doc = loaders.load_json(str(path), loaders.stamp(path))
    secs = doc.get("seconds") if isinstance(doc, dict) else None
    if not isinstance(secs, dict) or not secs:
        return
    st.markdown("**Pipeline timings** (`demo_timings.json`, seconds)")
    st.dataframe(
        timings_frame(secs),
        hide_index=True,
        width="content",
        height="content",
        column_config={"seconds": st.column_config.NumberColumn(format="%.1f")},
    )


#: Stages of ``geodbk demo`` in the order it runs them (``total`` last).
STAGE_ORDER = ("ingest", "train", "predict", "trend", "export", "service", "summarize", "report")


def timings_frame(secs: dict[str, Any]) -> pd.DataFrame:
    """``demo_timings.json``'s seconds as rows ``stage``, ``seconds`` in the order the demo runs
    its stages (the file lists them alphabetically), each stage's targets in the sidebar's
    order, unknown stages after the known ones and ``total`` last."""

    def rank(name: str) -> tuple[int, int, str]:
        stage, _, target = name.partition("_")
        if name == "total":
            return (len(STAGE_ORDER) + 1, 0, name)
        where = STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)
        return (where, TARGETS.index(target) if target in TARGETS else len(TARGETS), name)

    rows = [
        {"stage": k.replace("_", " "), "seconds": float(v)}
        for k, v in sorted(secs.items(), key=lambda kv: rank(str(kv[0])))
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    return pd.DataFrame(rows, columns=["stage", "seconds"])
