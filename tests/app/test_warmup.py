"""The background warm-up: one job per key, retried after a failure, off on request."""

from __future__ import annotations

import pytest


def test_warmup_runs_a_job_once_per_key_and_retries_after_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from app import warmup

    monkeypatch.setenv("GEODBK_APP_WARMUP", "1")
    done = threading.Event()
    calls: list[int] = []

    def job() -> None:
        calls.append(1)
        done.set()

    assert warmup.start("unit-test-key", job)
    assert done.wait(10)
    assert not warmup.start("unit-test-key", job)
    assert calls == [1]

    failed = threading.Event()

    def bad() -> None:
        failed.set()
        raise RuntimeError("boom")

    assert warmup.start("unit-test-bad", bad)
    assert failed.wait(10)
    for _ in range(100):  # the failed key is released so a later page can retry
        if "unit-test-bad" not in warmup._started:
            break
        threading.Event().wait(0.01)
    assert "unit-test-bad" not in warmup._started
    monkeypatch.setenv("GEODBK_APP_WARMUP", "0")
    assert not warmup.start("unit-test-off", job)
