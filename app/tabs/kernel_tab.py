"""Kernel slices: k(., x_ref) over the region for preset and clicked reference points."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st

from app import layers as L
from app import loaders, maps
from app.colormaps import CMAPS, ColorScale, Legend, format_lonlat, legend_html
from app.context import RunContext
from app.kernel import RefPoint, kernel_slice, normalise_slice
from app.points import point_from_selection
from app.quarters import is_time_aware, time_input, time_scaling, with_time
from app.ui import missing, quarter_slider

CLICKS_KEY = "kernel_clicks"
MAX_CLICKS = 3
PER_ROW = 3
SLICE_HEIGHT = 300


def shared_scale(images: list[np.ndarray]) -> ColorScale:
    """One colour range for all slices: from the smallest shown value (rounded down) to 1."""
    lows = [float(np.nanmin(im)) for im in images if np.isfinite(im).any()]
    low = min(lows) if lows else 0.0
    low = max(0.0, min(0.9, np.floor(low * 20) / 20)) if low >= 0 else low
    return ColorScale(CMAPS["kernel"], low, 1.0, False)


def _on_click(chart_key: str) -> None:
    """Add the clicked location as a new reference point (oldest click dropped past the cap)."""
    point = point_from_selection(st.session_state.get(chart_key), L.CLICKABLE_LAYERS)
    if point is None:
        return
    clicks: list[tuple[float, float]] = list(st.session_state.get(CLICKS_KEY, []))
    if point not in clicks:
        clicks.append(point)
    st.session_state[CLICKS_KEY] = clicks[-MAX_CLICKS:]


def _clear() -> None:
    st.session_state[CLICKS_KEY] = []


def features(ctx: RunContext, t: float | None = None) -> loaders.GridFeatures:
    """phi(grid) of the chosen model and grid at time input ``t`` (None: a pooled model).

    Cached: computed once per model, grid and t.
    """
    weights = ctx.files.model_dir / "weights.safetensors"
    scaling = tuple(sorted(ctx.scaling().items()))
    return loaders.grid_features(
        str(ctx.files.model_dir),
        loaders.stamp(weights),
        str(ctx.files.grid),
        loaders.stamp(ctx.files.grid),
        ctx.target,
        scaling,
        t,
    )


def default_time(ctx: RunContext) -> float | None:
    """t of the default quarter (``grids/TARGET.nc``'s) for a time-aware model, else None."""
    md = ctx.model_metadata()
    if not is_time_aware(md):
        return None
    return time_input(md, ctx.current_quarter())


def choose_time(ctx: RunContext, where: str) -> tuple[str | None, float | None]:
    """For a time-aware model, the quarter slider (shared with the Map and Inspect tabs) and
    its time input t (app.quarters.time_input); ``(None, None)`` for a pooled model."""
    md = ctx.model_metadata()
    if not is_time_aware(md):
        return None, None
    options = ctx.model_quarter_options()
    if not options:
        raise loaders.LoadError(
            f"{ctx.files.model_dir / 'model.json'}: the time-aware model records no quarters "
            "(metadata 'quarters' / 'time_scaling'); retrain it with `geodbk train --time`."
        )
    ts = time_scaling(md)
    default = ctx.current_quarter() or options[-1]
    labels = {q: f"{q} (extrapolation)" if ts.is_extrapolation(q) else q for q in options}
    quarter = quarter_slider(
        ctx.target,
        options,
        where=where,
        default=default,
        labels=labels,
        help="The model takes the quarter as an input (trained with --time). "
        f"Trained on {ts.first}–{ts.last}; later quarters are extrapolations.",
        disabled=len(options) < 2,
    )
    if ts.is_extrapolation(quarter):
        st.caption(f"⚠ {quarter}: {ts.describe(quarter)} (outside the training quarters).")
    return quarter, time_input(md, quarter)


def slice_image(
    ctx: RunContext, feats: loaders.GridFeatures, ref: RefPoint, t: float | None = None
) -> np.ndarray:
    """The normalised slice k(., ref)/max k as a 2-D array (NaN outside the region).

    For a time-aware model the grid and the reference share one quarter:
    ``k((x, t), (x_ref, t))``.
    """
    model = ctx.model()
    x_ref = loaders.scale_lonlat(np.array([ref.lon]), np.array([ref.lat]), ctx.scaling())
    phi_ref = np.asarray(model.features(with_time(x_ref, t)), dtype=np.float32)[0]
    values = normalise_slice(kernel_slice(feats.phi, phi_ref))
    image = np.full(feats.shape, np.nan)
    image[feats.rows, feats.cols] = values
    return image


def render(ctx: RunContext) -> None:
    """Render the kernel-slice tab."""
    st.markdown(
        "How strongly the model ties each place to a reference location: the prior kernel "
        "slice $k(\\cdot, x_{ref}) = \\phi(\\cdot)^\\top \\phi(x_{ref})$ over the region, divided "
        "by its maximum over the grid. Compare an urban, a rural and a remote reference."
    )
    if not ctx.files.has_model:
        missing(f"This run has no trained {ctx.target} model.", ctx.cmd("train"))
        return
    if not ctx.files.has_grid:
        missing(f"This run has no predictive grid for {ctx.target}.", ctx.cmd("predict"))
        return
    presets = ctx.presets() if ctx.inv.has_tiles else []
    names = [p.name for p in presets]
    c1, c2 = st.columns([3, 1])
    chosen = c1.multiselect(
        "Preset reference points",
        names,
        default=names,
        key=f"kernel_presets_{ctx.target}",
        help="Urban: densest urban tile · Rural: tile with the median data density among rural "
        "tiles · Remote: tile farthest from any other observation.",
    )
    clicks: list[tuple[float, float]] = list(st.session_state.get(CLICKS_KEY, []))
    c2.button("Clear clicked points", on_click=_clear, disabled=not clicks, key="kernel_clear")
    refs = [p for p in presets if p.name in chosen]
    refs += [
        RefPoint(f"Clicked {i + 1}", lon, lat, "clicked on a slice map")
        for i, (lon, lat) in enumerate(clicks)
    ]
    if not refs:
        st.info("Pick a preset reference point above, or click the map to add a slice there.")
    quarter, t_in = choose_time(ctx, "kernel")
    with st.spinner("Computing φ(grid) once for this model…"):
        feats = features(ctx, t_in)
    grid = ctx.grid()
    pick, radius = maps.click_points(str(ctx.files.grid), maps.grid_stamp(ctx), ctx.target)
    pick = pick.assign(label="click to add a kernel slice here")
    overlays = maps.overlay_layers(ctx)
    timings: list[float] = []
    images: list[np.ndarray] = []
    for ref in refs:
        t0 = time.perf_counter()
        images.append(slice_image(ctx, feats, ref, t_in))
        timings.append(time.perf_counter() - t0)
    scale = shared_scale(images)
    for start in range(0, len(refs), PER_ROW):
        cols = st.columns(PER_ROW)
        for j, (col, ref) in enumerate(zip(cols, refs[start : start + PER_ROW], strict=False)):
            t0 = time.perf_counter()
            url = maps.raster_url(images[start + j], feats.lat, scale)
            timings[start + j] += time.perf_counter() - t0
            marker = pd.DataFrame(
                {"lon": [ref.lon], "lat": [ref.lat], "label": [ref.label], "name": [ref.name]}
            )
            layer_list = [
                L.bitmap_layer(url, grid.bounds, "kernel"),
                L.click_grid_layer(pick, radius),
                *overlays,
                *L.markers_layer(marker),
            ]
            key = f"kernel_chart_{start + j}"
            with col:
                st.markdown(f"**{ref.name}** · {format_lonlat(ref.lon, ref.lat, 3)}")
                st.pydeck_chart(
                    L.deck(layer_list, grid.bounds, width_px=300, height_px=SLICE_HEIGHT),
                    height=SLICE_HEIGHT,
                    on_select=lambda key=key: _on_click(key),
                    selection_mode="single-object",
                    key=key,
                )
                st.caption(ref.description)
    if not refs:
        url, _scale, _legend = maps.grid_layer_png(
            str(ctx.files.grid), maps.grid_stamp(ctx), ctx.target, maps.LayerSpec("median")
        )
        layer_list = [L.bitmap_layer(url, grid.bounds), L.click_grid_layer(pick, radius), *overlays]
        st.pydeck_chart(
            L.deck(layer_list, grid.bounds, height_px=SLICE_HEIGHT),
            height=SLICE_HEIGHT,
            on_select=lambda: _on_click("kernel_chart_pick"),
            selection_mode="single-object",
            key="kernel_chart_pick",
        )
    if images:
        st.markdown(
            legend_html(
                Legend(
                    "k(x, x_ref) / max over the region",
                    scale,
                    "",
                    note="One colour range for all panels, from the smallest value shown to 1.",
                )
            ),
            unsafe_allow_html=True,
        )
    if timings:
        when = (
            f"At quarter {quarter} (t = {t_in:.2f}) for the grid and the reference point alike. "
            if quarter is not None and t_in is not None
            else ""
        )
        st.caption(
            f"{when}φ(grid): {feats.phi.shape[0]:,} cells × {feats.phi.shape[1]} basis functions, "
            f"computed once in {feats.seconds:.2f} s and cached. Each slice: "
            f"{1000 * float(np.mean(timings)):.0f} ms (one matrix-vector product + PNG). "
            "Click any slice map to add a slice at that point."
        )
