"""The model registry (geodbk/baselines/registry.py): every name, both presets (issue 24) and
what each sets, the shared budget each family takes, and the parsing of model lists."""

from __future__ import annotations

import pytest
from baseline_helpers import BUDGET, FIT_SETTINGS

from geodbk.baselines.registry import (
    MODEL_NAMES,
    PAPER_PRESET,
    PRESETS,
    TUNED_PRESET,
    build_model,
    model_kwargs,
    parse_model_list,
)


def _params(name: str, preset: str) -> dict:
    return dict(build_model(name, preset=preset, **BUDGET).get_params())


def test_every_model_has_both_presets_and_builds_with_them() -> None:
    assert set(PRESETS) == {"paper", "tuned"}
    assert set(PAPER_PRESET) == set(TUNED_PRESET) == set(MODEL_NAMES)
    for name in MODEL_NAMES:
        for preset, settings in (("paper", PAPER_PRESET), ("tuned", TUNED_PRESET)):
            params = _params(name, preset)
            for key, value in settings[name].items():
                assert params[key] == value, (name, preset, key)
            assert params["epochs"] == 1 and params["batch_size"] == 64, name


@pytest.mark.parametrize(
    ("name", "key", "paper", "tuned"),
    [
        # the seed (000): noise 1e-2 and lr 1e-3 for its SVGP-ELBO comparison models
        ("sv-rbf", "noise_init", 1e-2, 0.5),
        ("sv-rbf", "lr", 1e-3, 0.01),
        ("sv-dkl", "noise_init", 1e-2, 0.5),
        ("vbll", "noise_init", 1e-2, 0.5),
        ("pp-dkl", "noise_init", 1e-2, 0.5),
        ("exact-dbk", "noise_init", 1e-2, 0.5),
        ("exact-rbf", "lr", 1e-3, 0.05),
        # paper 001: weight decay 1e-4, noise 1e-2
        ("svdbk", "weight_decay", 1e-4, 1e-2),
        ("svdbk", "noise_init", 1e-2, 0.5),
        # paper 002: lr from its sweep (0.1 on the large low-dimensional sets)
        ("cagp", "lr", 0.1, 0.05),
        # paper 004: beta² = 1e-3, fixed (learn_noise=False)
        ("softki", "noise_init", 1e-3, 0.5),
    ],
)
def test_presets_differ_where_the_papers_do(
    name: str, key: str, paper: float, tuned: float
) -> None:
    assert _params(name, "paper")[key] == pytest.approx(paper)
    assert _params(name, "tuned")[key] == pytest.approx(tuned)


@pytest.mark.parametrize(
    ("name", "key", "paper", "tuned"),
    [
        # paper 003 App. G: one lengthscale shared by all inputs, no whitening
        ("solve-gp", "ard", False, True),
        ("solve-gp", "whiten", False, True),
        # the seed (000) App. B: RBF lengthscales initialised at sqrt(d)
        ("exact-rbf", "lengthscale_init", "sqrt_d", "value"),
    ],
)
def test_presets_differ_in_options(name: str, key: str, paper: object, tuned: object) -> None:
    assert _params(name, "paper")[key] == paper
    assert _params(name, "tuned")[key] == tuned


def test_presets_agree_where_the_project_follows_the_paper() -> None:
    """DBK-RBF/SiLU are the seed's own models: tuned = paper."""
    for name in ("dbk-rbf", "dbk-silu"):
        assert _params(name, "paper") == _params(name, "tuned"), name


#: The tuned preset's SOLVE-GP and exact-RBF options before the paper options existed, and
#: the new options at the values that keep that behaviour (whitened, ARD, lengthscale 0.3).
TUNED_BEFORE = {
    "solve-gp": {
        "num_inducing": 8,
        "num_orthogonal": 8,
        "lengthscale": 0.3,
        "noise_init": 0.5,
        "epochs": 1,
        "batch_size": 64,
        "lr": 0.01,
        "patience": 1,
        "seed": 0,
        "device": "cpu",
        "dtype": "float32",
        "noise": "constant",
        "noise_power": False,
    },
    "exact-rbf": {
        "max_n": 5000,
        "lengthscale": 0.3,
        "noise_init": 0.5,
        "epochs": 1,
        "batch_size": 64,
        "lr": 0.05,
        "patience": 1,
        "seed": 0,
        "device": "cpu",
        "dtype": "float64",
        "noise": "constant",
        "noise_power": False,
    },
}
NEW_OPTIONS = {
    "solve-gp": {"ard": True, "whiten": True},
    "exact-rbf": {"lengthscale_init": "value"},
}


@pytest.mark.parametrize("name", ["solve-gp", "exact-rbf"])
def test_tuned_preset_keeps_its_hyperparameters(name: str) -> None:
    assert TUNED_PRESET[name] == {}
    assert _params(name, "tuned") == {**TUNED_BEFORE[name], **NEW_OPTIONS[name]}
    # the new options' defaults are the tuned behaviour (library default and old bundles)
    assert {k: _params(name, "tuned")[k] for k in NEW_OPTIONS[name]} == NEW_OPTIONS[name]


def test_overrides_win_over_the_preset_and_the_budget_is_shared() -> None:
    kw = model_kwargs("sv-rbf", preset="paper", overrides={"lr": 0.2}, **BUDGET)
    assert kw["lr"] == 0.2 and kw["noise_init"] == 1e-2 and kw["rank"] == 8
    with pytest.raises(ValueError, match="unknown preset"):
        model_kwargs("sv-rbf", preset="nope", **BUDGET)


def test_registry_covers_every_name() -> None:
    assert set(FIT_SETTINGS) == set(MODEL_NAMES)


def test_model_lists_and_each_familys_share_of_the_budget() -> None:
    """parse_model_list reads names (any case, with spaces) or "all" and refuses unknown or
    empty lists; model_kwargs gives each family its sizes from rank and refuses unknown names."""
    assert parse_model_list(" SV-RBF, cagp ") == ["sv-rbf", "cagp"]
    assert parse_model_list("all") == list(MODEL_NAMES)
    for bad in ("sv-rbf,nope", "", " , "):
        with pytest.raises(ValueError, match="unknown model"):
            parse_model_list(bad)
    kw = dict(epochs=3, batch_size=16, seed=1, rank=300, hidden=12)
    solve = model_kwargs("solve-gp", **kw)
    assert solve["num_inducing"] == solve["num_orthogonal"] == 300 and solve["patience"] == 3
    assert model_kwargs("softki", **kw)["num_points"] == 300
    assert model_kwargs("cagp", **kw)["n_actions"] == 512  # min(512, 2 rank)
    assert model_kwargs("cagp", **{**kw, "rank": 100})["n_actions"] == 200
    deep = model_kwargs("sv-dkl", **kw, patience=0)
    assert (deep["rank"], deep["hidden"], deep["patience"]) == (300, 12, 1)  # patience >= 1
    exact = model_kwargs("exact-rbf", **kw)
    assert exact["patience"] == 3 and "rank" not in exact and "hidden" not in exact
    with pytest.raises(ValueError, match="unknown model"):
        model_kwargs("nope", **kw)
