"""Training-step time and prediction throughput: DBK-RBF / DBK-SiLU vs GPyTorch SV-RBF / SV-DKL.

All four models are timed side by side in one process at the same rank r (basis functions =
inducing points), backbone width h and batch size b, on 2-D inputs (lon/lat scaled to [-1, 1]):

* DBK-RBF  — geodbk ``DBKModel(expansion="rbf")``, dPPGP loss; prediction with the folded weights
  (one backbone pass + two r-vector products per point).
* DBK-SiLU — geodbk ``DBKModel(expansion="silu")``, dPPGP loss.
* SV-RBF   — GPyTorch SVGP on the raw inputs (RBF-ARD, r inducing points, whitened
  ``VariationalStrategy``, ``CholeskyVariationalDistribution``), ELBO.
* SV-DKL   — the same SVGP on ``g(x)`` from the same ``ResidualMLP`` backbone (plain
  ``ApproximateGP`` with r inducing points in R^h, no grid interpolation), ELBO.

A training step = forward + loss + backward + AdamW step (torch's fused kernel, for every model,
as `geodbk train` uses it) on one batch. Prediction = predictive
mean and variance (noise included) for ``--n-pred`` points in chunks of ``--chunk`` under
``torch.no_grad()`` (GPyTorch: eval mode, ``fast_pred_var``, caches warmed first). The run
also measures the machine's fp32 matrix-product rate (:func:`matmul_gflops`), and each DBK row
states its prediction's FLOPs per point and the time over the floor they set at that rate.
The process runs with the allocator settings of the ``geodbk`` command
(:func:`pipelines.allocator.keep_freed_memory`, for every model; ``--default-malloc``: glibc's
own, under which a step's fresh buffers fault their pages in again at random).

Usage::

    .venv/bin/python benchmarks/bench_core.py --threads 2 [--out bench.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pipelines.allocator import keep_freed_memory
from pipelines.benchmark import cpu_model


def _timeit(fn: Callable[[], Any], *, warmup: int, reps: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------------------- DBK models
def make_dbk(
    expansion: str, r: int, h: int, n: int, device: torch.device, *, kernel_update_every: int = 1
) -> dict[str, Any]:
    """DBK model, its dPPGP training step and its folded predictor. With
    ``kernel_update_every`` K > 1 one call of ``step`` takes K steps, as the training loop
    does (the first updating the RBF kernel, the others holding it; ``steps_per_call``)."""
    from geodbk.hyperparameters import DBKHyperparameters
    from geodbk.model import DBKModel
    from geodbk.steps import minibatch_step
    from geodbk.training import LoopConfig

    torch.manual_seed(0)
    model = DBKModel(2, expansion=expansion, rank=r, hidden=h).to(device)
    config = LoopConfig.of(
        DBKHyperparameters(
            objective="dppgp", alpha=0.1, beta=0.01, kernel_update_every=kernel_update_every
        )
    )
    opt = torch.optim.AdamW(
        [
            {"params": model.backbone_parameters(), "weight_decay": 1e-2},
            {"params": model.other_parameters(), "weight_decay": 0.0},
        ],
        lr=1e-3,
        fused=True,
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        model.train()
        for i in range(kernel_update_every):
            minibatch_step(model, opt, x, y, n=n, config=config, batch=i)

    state: dict[str, Any] = {}

    def prepare() -> None:
        model.eval()
        state["folded"] = model.fold()

    def predict(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, _, var = model.predict_folded(x, state["folded"])
        return mean, var

    def flops_per_point() -> float:
        """Multiply-adds x 2 of one folded prediction: backbone, k_Z(g), mean and variance."""
        folded = state["folded"]
        total = sum(
            2.0 * mod.in_features * mod.out_features
            for mod in model.backbone.modules()
            if isinstance(mod, torch.nn.Linear)
        )
        total += 2.0 * h * r  # the kernel (or SiLU layer) to the r basis functions
        total += 2.0 * r  # the mean u'a
        width = folded.block_width  # the variance ||C'u||^2, over C's lower-triangular blocks
        if width > 0:
            total += sum(2.0 * (r - s) * min(width, r - s) for s in range(0, r, width))
        else:
            total += 2.0 * r * folded.factor.shape[1]
        if folded.whitener is not None:
            total += 2.0 * r * folded.whitener.shape[1]
        return total

    return {
        "step": step,
        "prepare": prepare,
        "predict": predict,
        "flops": flops_per_point,
        "steps_per_call": kernel_update_every,
    }


def matmul_gflops(device: torch.device) -> float:
    """The best fp32 matrix-product rate (GFLOP/s) over a few shapes, in this process.

    The shapes are those of a seed-size prediction chunk (4096 x 1024 x 1024) and two square
    products; each is timed 5 times after a warm-up and the fastest run is kept.
    """
    best = 0.0
    for m, k, n in ((4096, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)):
        a = torch.randn(m, k, device=device)
        b = torch.randn(k, n, device=device)
        times = _timeit(lambda a=a, b=b: a @ b, warmup=1, reps=5, device=device)
        best = max(best, 2.0 * m * k * n / min(times) / 1e9)
    return best


# ---------------------------------------------------------------------------- GPyTorch SVGP
def make_svgp(kind: str, r: int, h: int, n: int, device: torch.device) -> dict[str, Any]:
    """GPyTorch SVGP on raw inputs (SV-RBF) or on g(x) (SV-DKL), its step and predictor."""
    import gpytorch

    from geodbk.backbone import ResidualMLP

    torch.manual_seed(0)
    dim = 2 if kind == "sv-rbf" else h

    class GPLayer(gpytorch.models.ApproximateGP):
        def __init__(self) -> None:
            z = torch.rand(r, dim) * 2 - 1
            dist = gpytorch.variational.CholeskyVariationalDistribution(r)
            strat = gpytorch.variational.VariationalStrategy(
                self, z, dist, learn_inducing_locations=True
            )
            super().__init__(strat)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=dim)
            )
            self.covar_module.base_kernel.lengthscale = math.sqrt(dim)

        def forward(self, x: torch.Tensor) -> Any:
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x)
            )

    class Model(gpytorch.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = ResidualMLP(2, h) if kind == "sv-dkl" else None
            self.gp = GPLayer()

        def forward(self, x: torch.Tensor) -> Any:
            return self.gp(self.backbone(x) if self.backbone is not None else x)

    model = Model().to(device)
    lik = gpytorch.likelihoods.GaussianLikelihood().to(device)
    mll = gpytorch.mlls.VariationalELBO(lik, model.gp, num_data=n)
    back = list(model.backbone.parameters()) if model.backbone is not None else []
    ids = {id(p) for p in back}
    rest = [p for p in [*model.parameters(), *lik.parameters()] if id(p) not in ids]
    groups = [{"params": rest, "weight_decay": 0.0}]
    if back:
        groups.append({"params": back, "weight_decay": 1e-2})
    opt = torch.optim.AdamW(groups, lr=1e-3, fused=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        model.train()
        lik.train()
        opt.zero_grad(set_to_none=True)
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()

    def prepare() -> None:
        model.eval()
        lik.eval()

    def predict(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with gpytorch.settings.fast_pred_var():
            out = lik(model(x))
            return out.mean, out.variance

    return {"step": step, "prepare": prepare, "predict": predict}


MAKERS: dict[str, Callable[..., dict[str, Any]]] = {
    "DBK-RBF": lambda r, h, n, dev: make_dbk("rbf", r, h, n, dev),
    "DBK-SiLU": lambda r, h, n, dev: make_dbk("silu", r, h, n, dev),
    "SV-RBF": lambda r, h, n, dev: make_svgp("sv-rbf", r, h, n, dev),
    "SV-DKL": lambda r, h, n, dev: make_svgp("sv-dkl", r, h, n, dev),
}


def bench_setting(
    r: int,
    h: int,
    b: int,
    *,
    n_pred: int,
    chunk: int,
    steps: int,
    device: torch.device,
    gflops: float,
    rounds: int = 1,
    kernel_update_every: int = 1,
) -> list[dict[str, Any]]:
    """Time every model at one (r, h, b) setting.

    With ``rounds`` = 1 each model is timed in turn: ``steps`` training steps, then three
    prediction passes. With more, the models take turns ``rounds`` times (``steps`` steps and
    one prediction pass each per round), so that a machine whose speed drifts slows every
    model alike, and the DBK models' ratios to SV-DKL are taken within each round (a
    ``ratios`` row: median, min and max over the rounds). A DBK row also gets its prediction's
    FLOPs per point and the floor they set at the machine's matrix-product rate ``gflops``:
    ``floor = FLOPs / rate``, and the measured time over that floor. With
    ``kernel_update_every`` K > 1 a fifth model, ``DBK-RBF kernel/K``, is DBK-RBF trained with
    the kernel held on all but one step in K; its step time is the mean over such K steps.
    """
    gen = torch.Generator().manual_seed(0)
    n_train = 100_000
    x_train = (torch.rand(b * 4, 2, generator=gen) * 2 - 1).to(device)
    y_train = torch.sin(3 * x_train[:, 0]) + 0.1 * torch.randn(b * 4, generator=gen).to(device)
    x_pred = (torch.rand(n_pred, 2, generator=gen) * 2 - 1).to(device)
    batches = [(x_train[i * b : (i + 1) * b], y_train[i * b : (i + 1) * b]) for i in range(4)]
    models = {name: maker(r, h, n_train, device) for name, maker in MAKERS.items()}
    if kernel_update_every > 1:
        models[f"DBK-RBF kernel/{kernel_update_every}"] = make_dbk(
            "rbf", r, h, n_train, device, kernel_update_every=kernel_update_every
        )
    step_times: dict[str, list[list[float]]] = {name: [] for name in models}
    pred_times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(rounds):
        for name, m in models.items():
            counter = {"i": 0}

            def one_step(m: dict[str, Any] = m, counter: dict = counter) -> None:
                xb, yb = batches[counter["i"] % len(batches)]
                counter["i"] += 1
                m["step"](xb, yb)

            per_call = m.get("steps_per_call", 1)
            times = _timeit(one_step, warmup=2 if round_ == 0 else 0, reps=steps, device=device)
            step_times[name].append([t / per_call for t in times])
            m["prepare"]()

            def predict_all(m: dict[str, Any] = m) -> None:
                with torch.no_grad():
                    for i in range(0, n_pred, chunk):
                        m["predict"](x_pred[i : i + chunk])

            if round_ == 0:
                with torch.no_grad():
                    m["predict"](x_pred[:chunk])  # warm caches (GPyTorch) / allocator
            pred_times[name] += _timeit(
                predict_all, warmup=0, reps=3 if rounds == 1 else 1, device=device
            )
    rows = []
    for name, m in models.items():
        t_pred = statistics.median(pred_times[name])
        every_step = [t for block in step_times[name] for t in block]
        rows.append(
            {
                "model": name,
                "r": r,
                "h": h,
                "b": b,
                "rounds": rounds,
                "step_ms_median": 1e3 * statistics.median(every_step),
                "step_ms_min": 1e3 * min(every_step),
                "predict_points_per_s": n_pred / t_pred,
                "predict_us_per_point": 1e6 * t_pred / n_pred,
            }
        )
        if "flops" in m:
            flops = m["flops"]()
            floor_s = flops / (gflops * 1e9)  # seconds per point at the matrix-product rate
            rows[-1]["predict_mflop_per_point"] = flops / 1e6
            rows[-1]["predict_floor_us_per_point"] = 1e6 * floor_s
            rows[-1]["predict_over_floor"] = (t_pred / n_pred) / floor_s
        print(json.dumps(rows[-1]), flush=True)
    if rounds > 1:
        rows.append({"ratios": round_ratios(step_times, pred_times), "r": r, "h": h, "b": b})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def round_ratios(
    step_times: dict[str, list[list[float]]], pred_times: dict[str, list[float]]
) -> dict[str, dict[str, float]]:
    """Each DBK model's step time over SV-DKL's and SV-DKL's prediction time over its, within
    each round (step: the round's median step), as median, min and max over the rounds."""
    out = {}
    base_steps = [statistics.median(block) for block in step_times["SV-DKL"]]
    for name in (n for n in step_times if n.startswith("DBK")):
        steps = [statistics.median(block) for block in step_times[name]]
        per_round = {
            f"{name} step / SV-DKL step": [a / c for a, c in zip(steps, base_steps, strict=True)],
            f"SV-DKL predict / {name} predict": [
                c / a for a, c in zip(pred_times[name], pred_times["SV-DKL"], strict=True)
            ],
        }
        for key, values in per_round.items():
            out[key] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
    return out


def main() -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description="DBK vs GPyTorch SVGP/SV-DKL timing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--n-pred", type=int, default=20_000)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument(
        "--settings",
        default="1024,256,1024;256,64,256",
        help="semicolon-separated r,h,b triples",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with more than 1, the models take turns this many times and the ratios to "
        "SV-DKL are taken within each round (robust to a machine whose speed drifts)",
    )
    ap.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's own allocator settings (default: those of the geodbk command, "
        "which reuse freed memory; the same for every model)",
    )
    ap.add_argument(
        "--kernel-every",
        type=int,
        default=1,
        help="with K > 1, also time DBK-RBF with kernel_update_every=K (the RBF kernel and "
        "inducing points updated on one step in K, held with Kzz's factor reused on the others)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    kept_freed_memory = False if args.default_malloc else keep_freed_memory()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    info = {
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "n_pred": args.n_pred,
        "chunk": args.chunk,
        "steps": args.steps,
        "rounds": args.rounds,
        "keeps_freed_memory": kept_freed_memory,
        "kernel_update_every": args.kernel_every,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info["matmul_gflops_fp32"] = matmul_gflops(device)
    print(json.dumps(info), flush=True)
    rows: list[dict[str, Any]] = []
    for triple in args.settings.split(";"):
        r, h, b = (int(v) for v in triple.split(","))
        rows += bench_setting(
            r,
            h,
            b,
            n_pred=args.n_pred,
            chunk=args.chunk,
            steps=args.steps,
            device=device,
            gflops=info["matmul_gflops_fp32"],
            rounds=args.rounds,
            kernel_update_every=args.kernel_every,
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"info": info, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
