"""Entry point: ``streamlit run app`` (from the repository root) runs this file.

Options after ``--``: ``--runs-dir DIR`` (the runs folder; default ``./runs`` or
``$GEODBK_RUNS_DIR``) and ``--run NAME`` (the run opened first; default ``demo``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from app.main import main  # noqa: E402

main()
