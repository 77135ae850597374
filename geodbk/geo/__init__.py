"""Geospatial I/O: quadkeys, Ookla tile readers, Census urban/rural layers, regions, the tile
table, the synthetic region generator (and, from other modules, grids and GeoTIFF export)."""
