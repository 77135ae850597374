"""Background warm-up: after the first paint, load the model and phi(grid) in a thread.

The map needs neither torch nor the model, so the first paint does not wait for them; the
kernel-slice and inspect tabs do. Warming them in the background right after the map is drawn
makes the first visit to those tabs fast. Failures are ignored here (the tabs report them).
Set ``GEODBK_APP_WARMUP=0`` to disable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

_started: set[str] = set()
_lock = threading.Lock()


def start(key: str, job: Callable[[], object]) -> bool:
    """Run ``job`` once per ``key`` in a daemon thread; return whether a thread was started."""
    if os.environ.get("GEODBK_APP_WARMUP", "1") == "0":
        return False
    with _lock:
        if key in _started:
            return False
        _started.add(key)

    def run() -> None:
        try:
            job()
        except Exception:  # the tab that needs it shows the error with the fix
            with _lock:
                _started.discard(key)

    thread = threading.Thread(target=run, name=f"geodbk-warmup-{len(_started)}", daemon=True)
    ctx = get_script_run_ctx()
    if ctx is not None:
        add_script_run_ctx(thread, ctx)
    thread.start()
    return True
