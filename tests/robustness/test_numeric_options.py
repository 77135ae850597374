"""Probes of every numeric option of every stage given a value no run can use: zero,
negative, NaN, infinite, out of range or degenerate. Each is refused before any work with the
documented exit code (3: a bad option value; 2: argparse's usage error), a message naming the
option and a valid value, no traceback, and the run directory unchanged.

``predict``'s --resolution, --tile-zoom and --max-cells are probed in test_predict_inputs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_helpers import BAD_INPUT, USAGE, copy_run, probe

REPO = Path(__file__).resolve().parents[2]
COUNTIES = REPO / "data" / "census" / "synthetic_counties.geojson"


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy for the module: every probe here must leave it unchanged."""
    return copy_run(tiny_run, tmp_path_factory.mktemp("probe_numeric") / "run")


def _ingest(run: Path, *extra: str, region: tuple[str, ...] | None = None) -> list[str]:
    from pipelines.ingest import demo_ingest_kwargs

    kw = demo_ingest_kwargs()
    where = region or ("--state", "SY", "--states-file", str(kw["states_file"]))
    return [
        "ingest", "--tiles", str(kw["tiles"][0]), "--type", "mobile", "--run", str(run), *where,
        "--urban-areas", str(kw["urban_areas"]), "--quarters", "2023Q1:2023Q4", *extra,
    ]  # fmt: skip


#: (stage arguments after ``--run RUN``, substrings of the message). ``RUN`` is filled in.
STAGE_ARGS: dict[str, list[str]] = {
    "train": ["train", "--run", "RUN", "--target", "download"],
    "predict": ["predict", "--run", "RUN", "--target", "download"],
    "report": ["report", "--run", "RUN", "--target", "download"],
    "service": ["service", "--run", "RUN"],
    "summarize": ["summarize", "--run", "RUN", "--target", "download", "--areas", str(COUNTIES)],
    "export": ["export", "--run", "RUN", "--target", "download"],
    "benchmark": ["benchmark", "--run", "RUN", "--target", "download", "--models", "dbk-rbf"],
    "demo": ["demo", "--quick", "--run", "RUN/../new-demo"],
}

CASES = [
    # train and demo: the most epochs
    ("train", ["--epochs", "0"], ("--epochs must be at least 1",)),
    ("train", ["--epochs", "-1"], ("--epochs must be at least 1",)),
    ("demo", ["--epochs", "0"], ("--epochs must be at least 1",)),
    ("demo", ["--epochs", "-3"], ("--epochs must be at least 1",)),
    # predict: the thresholds and the observation layers' K tests from M devices
    ("predict", ["--thresholds", "nan"], ("--thresholds", "positive finite Mbps", "25 100")),
    ("predict", ["--thresholds", "inf"], ("--thresholds", "positive finite Mbps")),
    ("predict", ["--thresholds", "25", "-1"], ("--thresholds", "got -1")),
    ("predict", ["--thresholds", "0"], ("--thresholds", "got 0")),
    ("predict", ["--tests", "0"], ("--tests must be >= 1",)),
    ("predict", ["--tests", "nan"], ("--tests must be >= 1",)),
    ("predict", ["--tests", "inf"], ("--tests must be >= 1",)),
    ("predict", ["--devices", "0"], ("--devices must be >= 1",)),
    ("predict", ["--devices", "nan"], ("--devices must be >= 1",)),
    ("predict", ["--devices", "inf"], ("--devices must be >= 1",)),
    # report: the service-coverage thresholds
    ("report", ["--thresholds", "nan"], ("--thresholds", "positive finite Mbps")),
    ("report", ["--thresholds", "inf"], ("--thresholds", "positive finite Mbps")),
    ("report", ["--thresholds", "-25"], ("--thresholds", "got -25")),
    ("report", ["--thresholds", "0"], ("--thresholds", "got 0")),
    # export has no numeric option: its quarter specs
    ("export", ["--quarter", "2023Q9"], ("bad quarter '2023Q9'", "like 2023Q4")),
    ("export", ["--trend", "2023Q4:2023Q1"], ("--trend", "must be after 2023Q4")),
    # service: tiers, latency, headline samples and the grid
    ("service", ["--tiers", "nan/3"], ("--tiers", "positive finite Mbps")),
    ("service", ["--tiers", "inf/3"], ("--tiers", "positive finite Mbps")),
    ("service", ["--tiers", "0/3"], ("--tiers", "positive finite Mbps")),
    ("service", ["--tiers", "100/20,25/3"], ("--tiers", "nested", "25/3,100/20")),
    ("service", ["--tiers", "abc"], ("--tiers", "DOWN/UP", "25/3,100/20")),
    ("service", ["--latency-ms", "nan"], ("--latency-ms must be a positive number",)),
    ("service", ["--latency-ms", "-1"], ("--latency-ms must be a positive number",)),
    ("service", ["--latency-ms", "0"], ("--latency-ms must be a positive number",)),
    ("service", ["--latency-ms", "inf"], ("--latency-ms must be a positive number",)),
    ("service", ["--headline-samples", "-1"], ("--headline-samples must be between 0",)),
    ("service", ["--headline-samples", "1000000"], ("--headline-samples must be between 0",)),
    ("service", ["--resolution", "0"], ("--resolution must be a positive cell size",)),
    ("service", ["--resolution", "-0.01"], ("--resolution must be a positive cell size",)),
    ("service", ["--resolution", "nan"], ("--resolution must be a positive cell size",)),
    ("service", ["--resolution", "inf"], ("--resolution must be a positive cell size",)),
    ("service", ["--resolution", "1000"], ("too coarse", "--resolution below")),
    ("service", ["--tile-zoom", "-1"], ("--tile-zoom", "1 to 23")),
    ("service", ["--tile-zoom", "30"], ("--tile-zoom", "1 to 23")),
    ("service", ["--max-cells", "0"], ("--max-cells must be at least 1",)),
    ("service", ["--max-cells", "-5"], ("--max-cells must be at least 1",)),
    # summarize: samples, seed and the grid
    ("summarize", ["--samples", "0"], ("--samples must be a whole number of at least 20",)),
    ("summarize", ["--samples", "-1"], ("--samples must be a whole number of at least 20",)),
    ("summarize", ["--samples", "19"], ("--samples must be a whole number of at least 20",)),
    ("summarize", ["--seed", "-1"], ("--seed must be a whole number of at least 0",)),
    ("summarize", ["--resolution", "0"], ("--resolution must be a positive cell size",)),
    ("summarize", ["--resolution", "-0.01"], ("--resolution must be a positive cell size",)),
    ("summarize", ["--resolution", "nan"], ("--resolution must be a positive cell size",)),
    ("summarize", ["--resolution", "inf"], ("--resolution must be a positive cell size",)),
    ("summarize", ["--resolution", "1000"], ("too coarse", "--resolution below")),
    ("summarize", ["--tile-zoom", "-1"], ("--tile-zoom", "1 to 23")),
    ("summarize", ["--tile-zoom", "30"], ("--tile-zoom", "1 to 23")),
    ("summarize", ["--max-cells", "0"], ("--max-cells must be at least 1",)),
    ("summarize", ["--max-cells", "-5"], ("--max-cells must be at least 1",)),
    # benchmark: the shared budget, refused before any model is trained
    ("benchmark", ["--epochs", "0"], ("--epochs must be a whole number of at least 1",)),
    ("benchmark", ["--epochs", "-1"], ("--epochs must be a whole number of at least 1",)),
    ("benchmark", ["--batch-size", "0"], ("--batch-size must be a whole number of at least 1",)),
    ("benchmark", ["--batch-size", "-1"], ("--batch-size must be",)),
    ("benchmark", ["--rank", "0"], ("--rank must be a whole number of at least 1",)),
    ("benchmark", ["--hidden", "0"], ("--hidden must be a whole number of at least 1",)),
    ("benchmark", ["--threads", "0"], ("--threads must be a whole number of at least 1",)),
    ("benchmark", ["--threads", "-1"], ("--threads must be",)),
    ("benchmark", ["--seeds", "0,-1"], ("--seeds must be whole numbers of at least 0",)),
    ("benchmark", ["--timeout", "0"], ("--timeout must be a positive number of seconds",)),
    ("benchmark", ["--timeout", "-1"], ("--timeout must be a positive number of seconds",)),
    ("benchmark", ["--timeout", "nan"], ("--timeout must be a positive number of seconds",)),
    ("benchmark", ["--set", "dbk-rbf.epochs=abc"], ("--set dbk-rbf.epochs='abc'", "refuses")),
    ("benchmark", ["--set", "cagp.epochs=3"], ("--set cagp.epochs", "not among --models")),
]


@pytest.mark.parametrize(
    ("stage", "extra", "names"), CASES, ids=[f"{s} {' '.join(e)}" for s, e, _ in CASES]
)
def test_a_bad_value_is_refused_naming_the_option(
    run: Path,
    stage: str,
    extra: list[str],
    names: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        str(run) if a == "RUN" else a.replace("RUN/..", str(run.parent)) for a in STAGE_ARGS[stage]
    ]
    probe([*argv, *extra], run=run, code=BAD_INPUT, names=names, capsys=capsys, watch=run.parent)


INGEST_CASES = [
    (["--seed", "-1"], None, ("--seed must be a whole number of at least 0",)),
    (["--split", "block", "--block-size", "0"], None, ("--block-size must be a positive",)),
    (["--split", "block", "--block-size", "-1"], None, ("--block-size must be a positive",)),
    (["--split", "block", "--block-size", "nan"], None, ("--block-size must be a positive",)),
    (["--split", "block", "--block-size", "inf"], None, ("--block-size must be a positive",)),
    (["--split", "block", "--block-size", "1000"], None, ("--block-size 1000", "smaller")),
    ([], ("--bbox", "nan", "39", "-99", "40"), ("bad --bbox", "WEST SOUTH EAST NORTH")),
    ([], ("--bbox", "-99", "39", "-100", "40"), ("bad --bbox", "west < east")),
    ([], ("--bbox", "-500", "39", "-99", "40"), ("bad --bbox", "in degrees")),
    ([], ("--bbox", "-100", "95", "-99", "96"), ("bad --bbox", "south < north")),
]


@pytest.mark.parametrize(
    ("extra", "region", "names"),
    INGEST_CASES,
    ids=[" ".join(e or r or ()) for e, r, _ in INGEST_CASES],
)
def test_a_bad_ingest_value_keeps_the_earlier_table(
    run: Path,
    extra: list[str],
    region: tuple[str, ...] | None,
    names: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    probe(_ingest(run, *extra, region=region), run=run, code=BAD_INPUT, names=names, capsys=capsys)


@pytest.mark.parametrize(
    "bbox",
    [
        ("nan", "0", "1", "1"),
        ("10", "0", "0", "1"),
        ("-500", "0", "0", "1"),
        ("0", "95", "1", "96"),
    ],
)
def test_a_bad_download_bbox_is_refused_before_any_transfer(
    tmp_path: Path, bbox: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before the network is asked (the URLs lead nowhere: a fetch would exit 1)."""
    cache = tmp_path / "cache"
    argv = [
        "download", "--cache", str(cache), "--quarters", "2023Q4", "--bbox", *bbox,
        "--base-url", "http://127.0.0.1:9/", "--census-base-url", "http://127.0.0.1:9/",
    ]  # fmt: skip
    probe(
        argv,
        run=tmp_path,
        code=BAD_INPUT,
        names=("bad --bbox", "WEST SOUTH EAST NORTH"),
        capsys=capsys,
    )
    assert not cache.exists()


@pytest.mark.parametrize(
    ("port", "code", "names"),
    [
        ("0", BAD_INPUT, ("--port must be between 1 and 65535",)),
        ("-1", BAD_INPUT, ("--port must be between 1 and 65535",)),
        ("70000", BAD_INPUT, ("--port must be between 1 and 65535",)),
        ("abc", USAGE, ("--port", "invalid int value")),
    ],
)
def test_a_bad_dashboard_port_is_refused(
    run: Path, port: str, code: int, names: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["dashboard", "--runs-dir", str(run.parent), "--port", port]
    probe(argv, run=run, code=code, names=names, capsys=capsys)


@pytest.mark.parametrize(
    ("stage", "extra"),
    [("service", ["--resolution", "0.0001"]), ("summarize", ["--resolution", "0.0001"])],
)
def test_a_grid_beyond_max_cells_needs_force(
    run: Path, stage: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The size guard of predict (test_predict_inputs.py) in the other grid stages."""
    argv = [str(run) if a == "RUN" else a for a in STAGE_ARGS[stage]]
    names = ("138,000,750 cells", "--max-cells 1,000,000", "--force")
    probe([*argv, *extra], run=run, code=BAD_INPUT, names=names, capsys=capsys)
