"""The package version, importable without the model stack."""

__version__ = "0.1.0"
