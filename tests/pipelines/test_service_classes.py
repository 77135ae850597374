"""Service classes from the three models: tiers, thresholds, probabilities and attributes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import FAKE_SERVICE_LEVELS, fake_service
from scipy.stats import norm

from geodbk.errors import DataError, RunDirectoryError
from geodbk.service import class_probabilities, tier_probabilities
from pipelines.rundir import RunDir
from pipelines.service_classes import require_service_models, resolve_tiers


def test_probabilities_are_the_copula_s_at_the_tiers_thresholds() -> None:
    service = fake_service()
    assert service.classes == ("unserved", "underserved", "served")
    thr = service.thresholds()
    np.testing.assert_allclose(
        thr, [[np.log10(25e3), np.log10(3e3), 2.0], [np.log10(100e3), np.log10(20e3), 2.0]]
    )
    got = service.predict(np.zeros(4), np.zeros(4))
    mean = np.tile([m for m, _ in FAKE_SERVICE_LEVELS.values()], (4, 1))
    sd = np.tile([s for _, s in FAKE_SERVICE_LEVELS.values()], (4, 1))
    tiers = tier_probabilities(mean, sd, thr, service.copula.correlation)
    np.testing.assert_allclose(got["p_tier_1"], tiers[:, 0])
    np.testing.assert_allclose(got["p_served"], class_probabilities(tiers)[:, 2])
    total = got["p_unserved"] + got["p_underserved"] + got["p_served"]
    np.testing.assert_allclose(total, 1.0)
    # 30/5 Mbps at 40 ms: tier 1 (25/3) likely, tier 2 (100/20) out of reach
    assert (got["service_class"] == 1).all()
    # tier 2 is at most as likely as its download part alone
    p_down = norm.sf((np.log10(100e3) - mean[:, 0]) / sd[:, 0])
    assert (got["p_tier_2"] <= p_down + 1e-12).all()


def test_quarters_descriptions_and_attributes(tmp_path: Path) -> None:
    assert fake_service().quarter == "2023Q4"
    mixed = fake_service(quarters=("2023Q4", "2023Q3", "2023Q4"))
    assert mixed.quarter == "download: 2023Q4; upload: 2023Q3; latency: 2023Q4"
    service = fake_service()
    assert service.class_descriptions()[0] == (
        "meets no tier: below 25/3 Mbps, or latency above 100 ms"
    )
    assert service.class_descriptions()[-1] == "meets 100/20 Mbps with latency at most 100 ms"
    attrs = service.attributes(RunDir(tmp_path))
    assert attrs["tiers"] == "25/3,100/20" and attrs["classes"] == "unserved underserved served"
    assert attrs["quantity_download"] == "tile: what the tile here typically gets (noise floor)"
    assert attrs["model_path_upload"] == "models/upload"
    assert attrs["copula_correlation"][1] == 0.5 and attrs["copula_rows"] == 40


def test_options_and_missing_models_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="--tiers"):
        resolve_tiers("25/3,10/1", 100.0)  # tiers must be nested, increasing
    with pytest.raises(DataError, match="--latency-ms must be a positive"):
        resolve_tiers("25/3", float("inf"))
    rd = RunDir(tmp_path)
    (rd.model_dir("upload")).mkdir(parents=True)
    (rd.model_dir("upload") / "model.json").write_text("{}")
    with pytest.raises(RunDirectoryError, match="no trained download or latency model") as info:
        require_service_models(rd)
    assert f"geodbk train --run {rd.root} --target latency" in str(info.value)
    assert "--target upload" not in str(info.value)


def test_models_of_different_periods_are_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pooled upload joined with time-aware download and latency is said, not silent."""
    from types import SimpleNamespace

    import pipelines.service_classes as sc

    quarters = {"download": "2023Q4", "upload": "pooled 2019Q1:2023Q4", "latency": "2023Q4"}
    monkeypatch.setattr(sc, "require_service_models", lambda rd: None)
    monkeypatch.setattr(
        sc, "load_place_predictor", lambda rd, t, **_: SimpleNamespace(quarter=quarters[t])
    )
    monkeypatch.setattr(sc, "estimate_copula", lambda rd, predictors: None)
    status = {"2023Q4": "observed", "pooled 2019Q1:2023Q4": "pooled"}
    monkeypatch.setattr(sc, "places_quarter_status", lambda rd, p, **_: (None, status[p.quarter]))
    with caplog.at_level("WARNING", logger="geodbk"):
        service = sc.load_service(RunDir(tmp_path))
    assert "different periods (download 2023Q4; upload pooled 2019Q1:2023Q4" in caplog.text
    # the status per target when they differ, one status when they agree
    assert service.quarter_status == "download: observed; upload: pooled; latency: observed"
    caplog.clear()
    quarters["upload"] = "2023Q4"
    with caplog.at_level("WARNING", logger="geodbk"):
        service = sc.load_service(RunDir(tmp_path))
    assert "different periods" not in caplog.text
    assert service.quarter_status == "observed"
