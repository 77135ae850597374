"""Does ``torch.compile`` pay for a DBK training step? Median seconds of a dPPGP step (forward,
loss, backward, AdamW) with the objective eager or compiled (inductor, default mode), one
process per mode, after 3 warm-up steps that include the compilation, on the CPU with the
``geodbk`` command's allocator settings (:func:`pipelines.allocator.keep_freed_memory`;
``--default-malloc``: glibc's own) or, with ``--device cuda``, on a GPU (synchronised);
``--expansion silu`` for DBK-SiLU::

    OMP_NUM_THREADS=1 python benchmarks/bench_compile.py --rank 256 --hidden 64 --batch 256 --mode eager
    OMP_NUM_THREADS=1 python benchmarks/bench_compile.py --rank 256 --hidden 64 --batch 256 --mode compile

Start each on a quiet machine (nothing else running, 1-minute load below 0.5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from profile_step import step_setup

from geodbk.objectives import batch_loss
from pipelines.allocator import keep_freed_memory


def main() -> None:
    """Print one JSON line: the mode, sizes, warm-up seconds and step milliseconds."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--expansion", choices=["rbf", "silu"], default="rbf")
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--default-malloc", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda (steps synchronised)")
    args = p.parse_args()
    kept_freed_memory = False if args.default_malloc else keep_freed_memory()
    torch.set_num_threads(1)
    model, config, opt, x, y = step_setup(
        args.expansion, args.rank, args.hidden, args.batch, device=args.device
    )
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return batch_loss(model, xb, yb, n=100_000, config=config)

    fn = torch.compile(loss) if args.mode == "compile" else loss

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        fn(x, y).backward()
        opt.step()
        sync()
        return time.perf_counter() - t0

    warmup = sum(step() for _ in range(3))
    times = [step() for _ in range(args.steps)]
    print(
        json.dumps(
            {
                "mode": args.mode,
                "device": args.device,
                "expansion": args.expansion,
                "keeps_freed_memory": kept_freed_memory,
                "rank": args.rank,
                "hidden": args.hidden,
                "batch": args.batch,
                "warmup_s": warmup,
                "step_ms_median": 1e3 * statistics.median(times),
                "step_ms_min": 1e3 * min(times),
            }
        )
    )


if __name__ == "__main__":
    main()
