"""How often a coverage's 95% interval holds the true rate when tiles of one place share it:
the interval counted by place (:func:`geodbk.metrics.share_interval_by_place`) against the
exact binomial interval over the tiles (:func:`geodbk.metrics.share_interval`).

Each draw puts tiles in ``--places`` places (geometric sizes of mean ``--mean-size``, as
Hawaii's 116 tile-split test tiles in 40 zoom-12 tiles); each place's rate is drawn from a
Beta of mean ``--rate`` and concentration ``a + b`` (intra-place correlation ``1 / (1 + a +
b)``; a very large one: independent tiles), and each tile is covered with its place's rate::

    python benchmarks/bench_place_interval.py --draws 2000

Prints one JSON line per concentration (``null``: independent tiles): the share of draws whose
interval holds the rate and the mean interval width, by place and by tile.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from geodbk.metrics import share_interval, share_interval_by_place


def held_shares(
    *,
    concentration: float,
    places: int,
    mean_size: float,
    rate: float,
    draws: int,
    seed: int,
) -> dict[str, float]:
    """Share of ``draws`` whose interval holds ``rate`` and its mean width, by place and by
    tile (module docstring)."""
    rng = np.random.default_rng(seed)
    held = {"place": 0, "tile": 0}
    width = {"place": 0.0, "tile": 0.0}
    for _ in range(draws):
        label = np.repeat(np.arange(places), rng.geometric(1.0 / mean_size, size=places))
        if np.isfinite(concentration):
            per_place = rng.beta(rate * concentration, (1.0 - rate) * concentration, places)
        else:
            per_place = np.full(places, rate)
        hits = rng.random(label.size) < per_place[label]
        intervals = {
            "place": share_interval_by_place(hits, label) or (0.0, 1.0),
            "tile": share_interval(int(hits.sum()), hits.size),
        }
        for name, (low, high) in intervals.items():
            held[name] += low <= rate <= high
            width[name] += high - low
    return {
        "concentration": concentration,
        "intra_place_correlation": 1.0 / (1.0 + concentration),
        **{f"held_by_{k}": v / draws for k, v in held.items()},
        **{f"width_by_{k}": v / draws for k, v in width.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--places", type=int, default=40)
    p.add_argument("--mean-size", type=float, default=2.9)
    p.add_argument("--rate", type=float, default=0.95)
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--concentrations", type=float, nargs="+", default=[1.0, 4.0, 20.0, float("inf")]
    )
    args = p.parse_args(argv)
    for concentration in args.concentrations:
        row = held_shares(
            concentration=concentration,
            places=args.places,
            mean_size=args.mean_size,
            rate=args.rate,
            draws=args.draws,
            seed=args.seed,
        )
        # an infinite concentration (independent tiles) is written as null
        print(json.dumps({k: round(v, 4) if np.isfinite(v) else None for k, v in row.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
