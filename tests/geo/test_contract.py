"""The run-directory contract: one definition of the targets and the 95% quantile, read by the
library, the pipelines and the dashboard alike."""

from __future__ import annotations

import subprocess
import sys

from scipy.stats import norm

from geodbk.geo import contract, table


def test_z95_is_the_normal_quantile() -> None:
    assert abs(contract.Z95 - norm.ppf(0.975)) < 1e-15


def test_every_layer_reads_the_same_targets() -> None:
    from app import runs
    from pipelines import rundir, service_classes

    assert contract.TARGETS == ("download", "upload", "latency")
    assert tuple(table.LOG_COLUMNS) == runs.TARGETS == contract.TARGETS
    assert service_classes.SERVICE_TARGETS == contract.TARGETS
    for name, info in contract.TARGET_INFO.items():
        assert runs.RAW_COLUMNS[name] == info.column
        assert table.LOG_COLUMNS[name] == info.log_column
        assert rundir.target_spec(name).unit == runs.UNITS[name] == info.unit
        assert rundir.target_spec(name).higher_is_better == info.higher_is_better


def test_the_contract_imports_nothing_heavy() -> None:
    code = (
        "import sys, geodbk.geo.contract; "
        "print(','.join(m for m in ('torch', 'geopandas', 'pandas', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_thresholds_have_one_definition() -> None:
    from app.tabs import map_tab
    from pipelines import rundir

    assert map_tab.DEFAULT_THRESHOLDS is contract.DEFAULT_THRESHOLDS
    assert rundir.DEFAULT_THRESHOLDS is contract.DEFAULT_THRESHOLDS
