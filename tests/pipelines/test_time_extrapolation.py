"""What a time-aware model does outside its trained quarters: ``hold`` or ``trend`` (issue 10)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from geodbk.errors import DataError
from geodbk.geo.timeaxis import TimeScaling, extrapolation_of, time_input
from pipelines.rundir import model_inputs
from pipelines.train import choose_time_extrapolation

TS = TimeScaling("2022Q1", "2023Q1")  # 4 quarter steps: one quarter = 0.5 in t


def _md(policy: str | None) -> dict[str, object]:
    md: dict[str, object] = {"inputs": ["x1", "x2", "t"], "time_scaling": TS.to_dict()}
    if policy is not None:
        md["time_extrapolation"] = {"policy": policy}
    return md


def test_time_input_policies() -> None:
    qs = ["2021Q4", "2022Q3", "2023Q2", "2024Q1"]
    np.testing.assert_allclose(time_input(TS, qs, extrapolation="trend"), [-1.5, 0.0, 1.5, 3.0])
    np.testing.assert_allclose(time_input(TS, qs, extrapolation="hold"), [-1.0, 0.0, 1.0, 1.0])
    with pytest.raises(DataError, match="extrapolation"):
        time_input(TS, qs, extrapolation="linear")


def test_model_inputs_follow_the_recorded_policy() -> None:
    X2 = np.zeros((2, 2))
    assert model_inputs(X2, _md("hold"), quarter="2024Q1")[0, 2] == 1.0
    assert model_inputs(X2, _md("trend"), quarter="2024Q1")[0, 2] == 3.0
    # bundles written before the policy existed keep extrapolating the trend
    assert extrapolation_of(_md(None)) == "trend"
    assert model_inputs(X2, _md(None), quarter="2024Q1")[0, 2] == 3.0


@dataclass
class _Pred:
    mean: np.ndarray
    var: np.ndarray


class _LinearInT:
    """A stand-in model whose mean is the time input itself (unit variance)."""

    tests_aware = False

    def predict_dist(self, X: np.ndarray) -> _Pred:
        return _Pred(mean=X[:, 2].copy(), var=np.ones(len(X)))


def test_policy_is_chosen_by_validation_nll() -> None:
    t = np.array([0.5, 1.5, 1.5, 2.0])
    X = np.column_stack([np.zeros((4, 2)), t])
    model = _LinearInT()
    # the speeds kept rising as the trend says: extrapolating wins
    got = choose_time_extrapolation(model, X, t.copy())
    assert got["policy"] == "trend" and got["val_rows_outside"] == 3
    assert got["val_nll"]["trend"] < got["val_nll"]["hold"]
    # the speeds stayed at the last trained level: holding wins
    got = choose_time_extrapolation(model, X, np.clip(t, -1, 1))
    assert got["policy"] == "hold"
    # no validation row outside the trained range: no evidence, hold
    inside = np.column_stack([np.zeros((2, 2)), [0.1, -0.3]])
    assert choose_time_extrapolation(model, inside, np.zeros(2)) == {
        "policy": "hold",
        "val_nll": None,
        "val_rows_outside": 0,
    }
