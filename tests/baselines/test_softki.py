"""SoftKI's options: the tuned model (defaults) and paper 004's version (registry preset "paper").

* ``z_init="kmeans"``: Z are scikit-learn's k-means centres of the training inputs.
* ``learn_noise=False`` keeps s2 at its initial value; ``ard=False`` has one lengthscale;
  ``learn_temperature=False`` keeps T.
* ``loss="hutchinson"``: its value is the exact batch NLL and its gradient, averaged over many
  probes, is the exact gradient (float64); one probe is not.
* ``solver="qr"`` (eqs. 26–30): predictive mean and latent variance against a dense float64 numpy
  GP with kernel W Kzz W' + D built from the parameters alone; each model factor scaled by 1.01
  must make the comparison fail (mutation checks).
* The paper version trains, predicts finite values and round-trips through save/load; the
  registry builds both presets, the tuned one with today's options.
* Against the dense GP with kernel Phi Phi' (float64): the posterior, the kernel
  W Kzz W' and the batch marginal likelihood, with constant noise s2 I and with the tests-aware
  D = diag(s2_i) (issue 9); the temperature is learned.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as nn_f
from baseline_helpers import dense_s2, region, set_tests_noise, speed_test_counts, standardised
from sklearn.cluster import KMeans

import geodbk.baselines.softki as softki_module
from geodbk.baselines.registry import PAPER_PRESET, build_model
from geodbk.baselines.softki import (
    SoftKIModule,
    SoftKIRegressor,
    batch_marginal_nll,
    hutchinson_pseudo_nll,
    whitened_batch_nll,
)

#: The options of paper 004 (as PAPER_PRESET["softki"] sets them).
PAPER: dict[str, Any] = {
    "z_init": "kmeans",
    "temperature": 1.0,
    "learn_temperature": False,
    "learn_noise": False,
    "ard": False,
    "loss": "hutchinson",
    "solver": "qr",
    "noise_init": 1e-3,
}


def _blobs(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four tight clusters in the plane: (X, y, true centres)."""
    rng = np.random.default_rng(seed)
    centres = np.array([[-0.7, -0.6], [0.6, -0.7], [-0.5, 0.7], [0.7, 0.6]])
    X = np.repeat(centres, 40, axis=0) + 0.03 * rng.standard_normal((160, 2))
    return X, np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(160), centres


# ---------------------------------------------------------------------------------- options
@pytest.mark.parametrize("small_n", [False, True])
def test_kmeans_init_puts_points_at_cluster_centres(
    small_n: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Z = k-means centres (KMeans; MiniBatchKMeans above KMEANS_MAX_N rows)."""
    X, y, centres = _blobs()
    if small_n:
        monkeypatch.setattr(softki_module, "KMEANS_MAX_N", 10)  # the MiniBatchKMeans branch
    est = SoftKIRegressor(num_points=4, epochs=0, z_init="kmeans", dtype="float64", seed=3)
    Z = est.fit(X, y).module_.Z.detach().numpy()
    # each point sits at one true centre, one point per cluster
    dist = np.linalg.norm(Z[:, None, :] - centres[None], axis=-1)
    assert sorted(dist.argmin(1).tolist()) == [0, 1, 2, 3]
    assert dist.min(1).max() < 0.02
    if not small_n:
        # exactly scikit-learn's KMeans with the model's seed, and each centre is the mean of
        # the training inputs closest to it
        ref = KMeans(n_clusters=4, n_init=1, random_state=3).fit(X).cluster_centers_
        np.testing.assert_allclose(Z, ref, rtol=0, atol=1e-12)
        label = np.linalg.norm(X[:, None] - Z[None], axis=-1).argmin(1)
        for k in range(4):
            np.testing.assert_allclose(Z[k], X[label == k].mean(0), atol=1e-12)
    # the tuned default: random training inputs (+1e-4 jitter), not the centres
    Zr = SoftKIRegressor(num_points=4, epochs=0).fit(X, y).module_.Z.detach().numpy()
    assert np.linalg.norm(Zr[:, None] - X[None], axis=-1).min(1).max() < 1e-3


def test_fixed_noise_single_lengthscale_and_fixed_temperature() -> None:
    X, y = region(120, seed=1)
    est = SoftKIRegressor(num_points=8, epochs=3, batch_size=40, **PAPER).fit(X, y)
    m = est.module_
    assert float(m.noise()) == pytest.approx(1e-3, rel=1e-6)
    assert est.noise_variance()[0] == pytest.approx(1e-3 * est.y_sd_**2, rel=1e-6)
    assert not any(p.requires_grad for p in m.noise.parameters())
    assert m.lengthscale.raw.numel() == 1 and m.lengthscale().shape == (1,)
    assert float(m.log_temperature) == 0.0 and not m.log_temperature.requires_grad
    assert float(m.lengthscale().detach()[0]) != pytest.approx(0.3, abs=1e-6)  # learned
    # the tuned defaults learn all three, with one lengthscale per input
    tuned = SoftKIRegressor(num_points=8, epochs=3, batch_size=40, noise_init=1e-3).fit(X, y)
    assert float(tuned.module_.noise().detach()) != pytest.approx(1e-3, rel=1e-3)
    assert tuned.module_.lengthscale.raw.numel() == 2
    assert float(tuned.module_.log_temperature.detach()) != pytest.approx(
        float(SoftKIRegressor(num_points=8, epochs=0).fit(X, y).module_.log_temperature.detach())
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("z_init", "grid"),
        ("loss", "elbo"),
        ("solver", "lu"),
        ("num_probes", 0),
        ("num_probes", 2.5),
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("learn_noise", "no"),
        ("ard", 1),
        ("learn_temperature", None),
    ],
)
def test_invalid_options_raise_value_error(option: str, value: Any) -> None:
    X, y = region(20, seed=0)
    with pytest.raises(ValueError, match=option):
        SoftKIRegressor(num_points=4, epochs=1, **{option: value}).fit(X, y)


# ---------------------------------------------------------------------------------- loss
def _batch(noise: str) -> tuple[SoftKIModule, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A float64 module with spread-out points and a batch of 25 rows."""
    torch.manual_seed(0)
    X, y = region(25, seed=2)
    m = SoftKIModule(2, 6, lengthscale=0.4, noise_init=0.05, noise=noise).double()
    with torch.no_grad():
        m.Z.copy_(torch.as_tensor(region(6, seed=3)[0]))
        m.log_temperature.fill_(np.log(0.3))
    tests = torch.as_tensor(np.random.default_rng(4).integers(1, 9, 25).astype(float))
    return m, torch.as_tensor(X), torch.as_tensor(y), tests if noise == "tests" else None


def _grads(m: SoftKIModule, loss: torch.Tensor) -> np.ndarray:
    params = [p for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return np.concatenate(
        [
            np.zeros(p.numel()) if g is None else g.reshape(-1).numpy()
            for p, g in zip(params, grads, strict=True)
        ]
    )


@pytest.mark.parametrize("solver", ["qr", "cholesky"])
@pytest.mark.parametrize("noise", ["constant", "tests"])
def test_hutchinson_pseudo_loss_is_unbiased(solver: str, noise: str) -> None:
    """Value = the exact batch NLL; mean gradient over 40,000 probes = the exact gradient."""
    m, X, y, tests = _batch(noise)

    def terms() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return m.features(X), y - m.mean_const, m.noise(tests)

    exact = batch_marginal_nll(*terms())
    g_exact = _grads(m, exact)
    whitened = float(whitened_batch_nll(*terms(), solver=solver).detach())
    assert whitened == pytest.approx(float(exact.detach()), rel=1e-8)  # jitter 1e-10 in Cholesky
    torch.manual_seed(1)
    pseudo = hutchinson_pseudo_nll(*terms(), solver=solver, num_probes=40_000)
    assert float(pseudo.detach()) == pytest.approx(whitened, rel=1e-8)
    g_mean = _grads(m, pseudo)
    err = np.linalg.norm(g_mean - g_exact) / np.linalg.norm(g_exact)
    assert err < 0.01  # about 0.002 at 40,000 probes
    # one probe is a noisy estimate, and the trace term matters: without it (the data term's
    # gradient alone) the estimate would be far off
    torch.manual_seed(2)
    g_one = _grads(m, hutchinson_pseudo_nll(*terms(), solver=solver, num_probes=1))
    assert np.linalg.norm(g_one - g_exact) / np.linalg.norm(g_exact) > 5 * err
    phi, r, s2 = terms()
    fac = softki_module.WhitenedFactor(phi.detach(), s2.detach(), solver=solver)
    b0 = fac.solve(r.detach().unsqueeze(-1))[:, 0]
    data_only = b0 @ r - 0.5 * b0 @ (phi @ (phi.T @ b0) + s2 * b0)
    g_data = _grads(m, data_only / X.shape[0])
    assert np.linalg.norm(g_data - g_exact) / np.linalg.norm(g_exact) > 10 * err


# ---------------------------------------------------------------------------------- QR solve
def _dense_reference(
    est: SoftKIRegressor, X: np.ndarray, y: np.ndarray, Xq: np.ndarray, tests: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Latent mean and variance (y units) of the GP with kernel W Kzz W' and noise D, dense.

    Built in numpy from Z, T, the lengthscale, outputscale, noise and mean only (Kzz with the
    model's relative jitter 1e-6 on its mean diagonal): mean = c + Q*x Sigma^{-1} r,
    var = diag(Q**) - diag(Q*x Sigma^{-1} Qx*), Sigma = Q_xx + D (004 eq. 14).
    """
    m = est.module_
    with torch.no_grad():
        Z = m.Z.numpy().copy()
        T = float(m.log_temperature.exp())
        ls = m.lengthscale().numpy().copy()
        os2 = float(m.outputscale())
        c = float(m.mean_const)
        t = None if tests is None else torch.as_tensor(tests)
        D = np.broadcast_to(m.noise(t).numpy(), (X.shape[0],))

    def W(A: np.ndarray) -> np.ndarray:
        logits = -np.linalg.norm(A[:, None] - Z[None], axis=-1) / T
        e = np.exp(logits - logits.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    Kzz = os2 * np.exp(-0.5 * (((Z[:, None] - Z[None]) / ls) ** 2).sum(-1))
    Kzz = Kzz + 1e-6 * np.diag(Kzz).mean() * np.eye(len(Z))
    Wx, Wq = W(X), W(Xq)
    Sigma = Wx @ Kzz @ Wx.T + np.diag(D)
    Qqx = Wq @ Kzz @ Wx.T
    r = (y - est.y_mean_) / est.y_sd_ - c
    mean = c + Qqx @ np.linalg.solve(Sigma, r)
    var = np.einsum("ij,jk,ik->i", Wq, Kzz, Wq) - np.einsum(
        "ij,ji->i", Qqx, np.linalg.solve(Sigma, Qqx.T)
    )
    return mean * est.y_sd_ + est.y_mean_, var * est.y_sd_**2


def _scaled(method: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        return 1.01 * method(*args, **kwargs)

    return wrapper


MUTATIONS = ["alpha", "R", "Kzz", "weights"]


@pytest.mark.parametrize("noise", ["constant", "tests"])
def test_qr_solve_matches_dense_reference_and_mutations_fail(
    noise: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    X, y = region(60, seed=5)
    Xq = region(9, seed=6)[0]
    rng = np.random.default_rng(7)
    tests = rng.integers(1, 9, 60).astype(float) if noise == "tests" else None
    options = {**PAPER, "noise_init": 0.05, "temperature": 0.3}
    est = SoftKIRegressor(
        num_points=8, epochs=3, batch_size=30, dtype="float64", noise=noise, **options
    ).fit(X, y, tests=tests)
    mean_ref, var_ref = _dense_reference(est, X, y, Xq, tests)

    def matches() -> bool:
        pred = est.predict_dist(Xq, quantity="latent")
        return bool(
            np.allclose(pred.mean, mean_ref, rtol=1e-7, atol=1e-9)
            and np.allclose(pred.var_f, var_ref, rtol=1e-6, atol=1e-10)
        )

    pred = est.predict_dist(Xq, quantity="latent")
    np.testing.assert_allclose(pred.mean, mean_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_ref, rtol=1e-6, atol=1e-10)
    # the Cholesky solver gives the same posterior from the same parameters
    chol = SoftKIRegressor(
        num_points=8, epochs=0, dtype="float64", noise=noise, **{**options, "solver": "cholesky"}
    ).fit(X, y, tests=tests)
    chol.module_.load_state_dict(est.module_.state_dict())
    yt = est._tensor((y - est.y_mean_) / est.y_sd_)
    Tt = None if tests is None else torch.as_tensor(tests)
    with torch.no_grad():
        chol._refresh(chol.module_, torch.as_tensor(X), yt, Tt)
    pc = chol.predict_dist(Xq, quantity="latent")
    np.testing.assert_allclose(pc.mean, mean_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(pc.var_f, var_ref, rtol=1e-6, atol=1e-10)

    module = est.module_
    state = {k: v.clone() for k, v in module.state_dict().items()}
    for mutation in MUTATIONS:
        with monkeypatch.context() as mp, torch.no_grad():
            if mutation == "alpha":
                module.alpha.mul_(1.01)
            elif mutation == "R":
                module.chol_Lambda.mul_(1.01)
            else:
                name = "kzz_chol" if mutation == "Kzz" else "weights"
                mp.setattr(SoftKIModule, name, _scaled(getattr(SoftKIModule, name)))
                est._refresh(module, torch.as_tensor(X), yt, Tt)
            assert not matches(), mutation
        module.load_state_dict(state)
    assert matches()


# ---------------------------------------------------------------------------------- paper version
def test_paper_version_trains_predicts_and_round_trips(tmp_path: Path) -> None:
    X, y = region(200, seed=8)
    Xv, yv = region(40, seed=9)
    est = build_model("softki", epochs=3, batch_size=64, seed=0, rank=16, preset="paper")
    assert {k: est.get_params()[k] for k in PAPER} == PAPER
    est.fit(X, y, Xv, yv)
    pred = est.predict_dist(Xv)
    assert np.isfinite(pred.mean).all() and np.isfinite(pred.var).all() and (pred.var > 0).all()
    assert len(est.history_) == 3 and all(np.isfinite(h["train_loss"]) for h in est.history_)
    est.save(tmp_path / "m")
    back = SoftKIRegressor.load(tmp_path / "m")
    assert back.get_params() == est.get_params()
    again = back.predict_dist(Xv)
    np.testing.assert_array_equal(again.mean, pred.mean)
    np.testing.assert_array_equal(again.var, pred.var)
    assert back.module_.lengthscale.raw.numel() == 1
    assert not any(p.requires_grad for p in back.module_.noise.parameters())


def test_registry_presets() -> None:
    """Paper: the paper's options; tuned: today's model (random Z, learned T and noise, ARD,
    exact MLL, Cholesky), whose fit is unchanged by the new options."""
    for preset in ("paper", "tuned"):
        est = build_model("softki", epochs=1, batch_size=32, seed=0, rank=8, preset=preset)
        assert isinstance(est, SoftKIRegressor)
    paper = build_model("softki", epochs=1, batch_size=32, seed=0, rank=8, preset="paper")
    assert {k: paper.get_params()[k] for k in PAPER} == PAPER
    assert {"lr": 0.01, **PAPER}.items() <= PAPER_PRESET["softki"].items()
    tuned = build_model("softki", epochs=1, batch_size=32, seed=0, rank=8, preset="tuned")
    assert {k: tuned.get_params()[k] for k in PAPER} == {
        "z_init": "random",
        "temperature": None,
        "learn_temperature": True,
        "learn_noise": True,
        "ard": True,
        "loss": "exact",
        "solver": "cholesky",
        "noise_init": 0.5,
    }


# ---------------------------------------------------------------------------------- dense formulas
def _softki_kernel(m: Any, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """w(a)' (Kzz + jitter) w(b) in numpy from the module's parameters (not its code):
    w(x) = softmax_j(-||x - z_j|| / T), Kzz the RBF-ARD kernel with the relative jitter 1e-6."""
    with torch.no_grad():
        Z = m.Z.double().numpy()
        ls, os2 = m.lengthscale().double().numpy(), float(m.outputscale())
        T = float(m.log_temperature.exp())

    def w(X: np.ndarray) -> np.ndarray:
        logits = -np.sqrt(((X[:, None, :] - Z[None, :, :]) ** 2).sum(-1)) / T
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    Kzz = os2 * np.exp(-0.5 * (((Z[:, None, :] - Z[None, :, :]) / ls) ** 2).sum(-1))
    Kzz += 1e-6 * np.mean(np.diag(Kzz)) * np.eye(len(Z))
    return w(A) @ Kzz @ w(B).T


def _compare_softki(est: SoftKIRegressor, X: np.ndarray, y: np.ndarray) -> None:
    """Posterior mean and var_f, the kernel and the batch marginal likelihood against the dense
    GP N(c, K + s2 I) with K from ``_softki_kernel``."""
    m = est.module_
    n = len(y)
    Xt = torch.as_tensor(X)
    Xq = region(13, seed=5)[0]
    with torch.no_grad():
        s2 = m.noise.floor + float(nn_f.softplus(m.noise.raw))
        c = float(m.mean_const)
        r = (y - est.y_mean_) / est.y_sd_ - c
        est._refresh(m, Xt, torch.as_tensor(r + c))
        nll = float(batch_marginal_nll(m.features(Xt), torch.as_tensor(r), m.noise()))
    Khat = _softki_kernel(m, X, X) + s2 * np.eye(n)
    Kq = _softki_kernel(m, Xq, X)
    mean = c + Kq @ np.linalg.solve(Khat, r)
    kqq = np.diag(_softki_kernel(m, Xq, Xq))
    var_f = kqq - np.einsum("ij,ji->i", Kq, np.linalg.solve(Khat, Kq.T))
    np.testing.assert_allclose(est.kernel(Xq, Xq), _softki_kernel(m, Xq, Xq), rtol=1e-9, atol=1e-12)
    dense_nll = -torch.distributions.MultivariateNormal(
        torch.zeros(n, dtype=torch.float64), torch.as_tensor(Khat)
    ).log_prob(torch.as_tensor(r))
    assert nll == pytest.approx(float(dense_nll) / n, rel=1e-9)
    pred = est.predict_dist(Xq)
    np.testing.assert_allclose(pred.mean, mean * est.y_sd_ + est.y_mean_, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * est.y_sd_**2, rtol=1e-6, atol=1e-10)


@pytest.fixture(scope="module")
def softki_fit() -> tuple[SoftKIRegressor, np.ndarray, np.ndarray]:
    X, y = region(80, seed=4)
    est = SoftKIRegressor(num_points=10, epochs=3, batch_size=40, dtype="float64").fit(X, y)
    return est, X, y


def test_softki_posterior_matches_dense_gp(softki_fit) -> None:
    _compare_softki(*softki_fit)


@pytest.mark.parametrize("factor", ["kzz", "weights", "noise", "variance solve"])
def test_softki_reference_fails_when_a_factor_is_perturbed(
    factor: str, softki_fit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation check: Kzz, one soft weight per row, s2 or the variance's solve scaled."""
    est, X, y = softki_fit
    m = est.module_
    if factor == "kzz":
        monkeypatch.setattr(softki_module, "rbf_ard", _scaled(softki_module.rbf_ard))
    elif factor == "weights":  # the first weight of each row
        weights = m.weights

        def bumped(Xb: torch.Tensor) -> torch.Tensor:
            w = weights(Xb).clone()
            w[:, 0] *= 1.01
            return w

        monkeypatch.setattr(m, "weights", bumped)
    elif factor == "noise":
        monkeypatch.setattr(m.noise, "forward", _scaled(m.noise.forward))
    else:
        monkeypatch.setattr(softki_module, "tri_solve", _scaled(softki_module.tri_solve))
    with pytest.raises(AssertionError):
        _compare_softki(est, X, y)
    monkeypatch.undo()
    _compare_softki(est, X, y)  # the fixture is left as it was


def test_softki_temperature_is_learned() -> None:
    X, y = region(200, seed=6)
    start = SoftKIRegressor(num_points=16, epochs=0, batch_size=50).fit(X, y)
    trained = SoftKIRegressor(num_points=16, epochs=5, batch_size=50).fit(X, y)
    t0 = float(start.module_.log_temperature.exp())
    t1 = float(trained.module_.log_temperature.exp())
    assert 0.0 < t0 < 0.5  # half the median nearest-neighbour spacing of the 16 points
    assert abs(t1 - t0) > 1e-4


def test_softki_tests_noise_matches_dense_gp() -> None:
    """N(c, Phi Phi' + D): batch marginal likelihood and the posterior over all training rows."""
    X, y = region(30, seed=17)
    tests = speed_test_counts(30, seed=17)
    est = SoftKIRegressor(
        num_points=8, epochs=2, batch_size=15, dtype="float64", noise="tests"
    ).fit(X, y, tests=tests)
    m = est.module_
    set_tests_noise(m.noise)
    Xt, yt, Tt = torch.as_tensor(X), standardised(est, y), torch.as_tensor(tests)
    Xq, tq = region(11, seed=18)[0], speed_test_counts(11, seed=18)
    with torch.no_grad():
        est._refresh(m, Xt, yt, Tt)
        Phi = m.features(Xt).numpy()
        Phq = m.features(torch.as_tensor(Xq)).numpy()
        r = yt.numpy() - float(m.mean_const)
        nll = float(batch_marginal_nll(torch.as_tensor(Phi), torch.as_tensor(r), m.noise(Tt)))
    Khat = Phi @ Phi.T + np.diag(dense_s2(tests))
    dense_nll = -torch.distributions.MultivariateNormal(
        torch.zeros(30, dtype=torch.float64), torch.as_tensor(Khat)
    ).log_prob(torch.as_tensor(r))
    assert nll == pytest.approx(float(dense_nll) / 30, rel=1e-9)
    Kq = Phq @ Phi.T
    mean = float(m.mean_const) + Kq @ np.linalg.solve(Khat, r)
    var_f = np.einsum("ij,ij->i", Phq, Phq) - np.einsum("ij,ji->i", Kq, np.linalg.solve(Khat, Kq.T))
    pred = est.predict_dist(Xq, tests=tq)
    sd = est.y_sd_
    np.testing.assert_allclose(pred.mean, mean * sd + est.y_mean_, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(pred.var_f, var_f * sd**2, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(pred.var, (var_f + dense_s2(tq)) * sd**2, rtol=1e-6)


@pytest.mark.parametrize("z_init", ["random", "kmeans"])
def test_softki_float32_fits_raw_coordinates_far_from_the_origin(z_init: str) -> None:
    """SoftKI depends on input differences only, so raw lon/lat near (-157, 21) in float32 fits
    as the same points near 0 do (it raised a Cholesky error: the squared distances cancelled)."""
    X, y = region(200, seed=0)
    offset = np.array([-157.0, 21.0])
    options = dict(num_points=16, epochs=2, batch_size=64, z_init=z_init, seed=0)
    far = SoftKIRegressor(**options).fit(X + offset, y)
    near = SoftKIRegressor(**options).fit(X, y)
    np.testing.assert_allclose(far.predict(X + offset), near.predict(X), atol=0.05)


def test_softki_features_are_the_kernel_factor_and_check_their_inputs() -> None:
    """``features(X) @ features(X').T == kernel(X, X')`` (standardised units, as
    DBKRegressor's), and X is checked as in predict: a wrong column count or a NaN raises."""
    from geodbk.errors import DataError

    X, y = region(120, seed=1)
    est = SoftKIRegressor(num_points=8, epochs=1, batch_size=32).fit(X, 5.0 * y)
    phi = est.features(X[:6])
    np.testing.assert_allclose(phi @ phi.T, est.kernel(X[:6], X[:6]), rtol=1e-4, atol=1e-6)
    with pytest.raises(DataError, match="X has 1 features"):
        est.features(X[:5, :1])
    with pytest.raises(DataError, match="NaN"):
        est.features(np.full((2, 2), np.nan))
