"""glibc's allocator settings of the geodbk process: freed megabyte blocks are reused, not
faulted in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHILD = """
import resource, sys
import numpy as np
from pipelines.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "tuned" else False
def churn():
    for _ in range(50):
        a = np.ones(1 << 21)  # 16 MB, allocated and freed as a model chunk's tensors are
        b = a * 2.0
        del a, b
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict[str, str] | None = None) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    applied, tuned = _faults("tuned")
    _, default = _faults("default")
    assert applied
    assert default > 10_000  # 100 blocks of 4,096 pages, each faulted in again
    assert tuned < default / 20


def test_opt_out_keeps_the_c_librarys_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.allocator import OPT_OUT, keep_freed_memory

    monkeypatch.setenv(OPT_OUT, "1")
    assert keep_freed_memory() is False
