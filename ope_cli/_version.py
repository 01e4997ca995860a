"""The package version, in a module of its own: modules that print it import it from here,
not from ``ope_cli`` (whose ``__init__`` exposes the API)."""

__version__ = "0.1.0"
