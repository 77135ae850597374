"""How long the dashboard's Places tab takes on a state-sized list of places.

Draws ``--places`` points in a run's region (:func:`pipelines.demo.write_demo_places`), runs
``geodbk predict --at`` on them (timed), then renders the Places tab in Streamlit's AppTest
twice (the first render reads the file; the second is a rerun) and prints the seconds, the
points drawn and the size of the map's JSON. The run gets ``places/bench_locations.csv`` and
its predictions; both are removed at the end::

    geodbk demo --run runs/demo
    OMP_NUM_THREADS=2 python benchmarks/bench_places_tab.py --run runs/demo --places 500000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--places", type=int, default=500_000)
    p.add_argument("--target", default="download")
    args = p.parse_args()
    from pipelines.demo import write_demo_places
    from pipelines.predict_at import run_predict_at

    run = args.run.resolve()
    drawn = write_demo_places(run, count=args.places, seed=1)
    places = drawn.with_name("bench_locations.csv")
    drawn.rename(places)
    t0 = time.perf_counter()
    out = run_predict_at(run, places, target=args.target)
    print(f"predict --at {args.places} places: {time.perf_counter() - t0:.1f} s")
    os.environ.update(
        GEODBK_RUNS_DIR=str(run.parent),
        GEODBK_RUN=run.name,
        GEODBK_APP_WARMUP="0",
        GEODBK_APP_REFINE_S="0",
    )
    sys.argv = ["streamlit_app.py"]
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(REPO / "app" / "streamlit_app.py"), default_timeout=600)
    at.run()
    at.session_state["view"] = "Places"
    try:
        for name in ("first", "rerun"):
            t0 = time.perf_counter()
            at.run()
            seconds = time.perf_counter() - t0
            tab = next(t for t in at.tabs if t.label == "Places")
            chart = tab.get("deck_gl_json_chart")[0].proto.json
            points = len(json.loads(chart)["layers"][0]["data"])
            print(
                f"Places tab, {name}: {seconds:.2f} s, {points} points, {len(chart) / 1e6:.1f} MB"
            )
    finally:
        places.unlink(missing_ok=True)
        for path in (out, out.with_suffix(".csv")):
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
