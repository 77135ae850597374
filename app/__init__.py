"""geodbk dashboard: a Streamlit + pydeck viewer of run directories (UI only, never trains).

Run it from the repository root with ``streamlit run app``. The modules are small and mostly
pure (``runs``, ``colormaps``, ``layers``, ``kernel``, ``points``) so they can be unit-tested
without a browser; ``loaders`` wraps file reading in Streamlit caches and ``tabs`` renders.
"""

from __future__ import annotations
