"""Batch stages that compose the geodbk library; each reads and writes a run directory."""
