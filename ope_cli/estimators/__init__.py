"""Estimators as plug-ins: ``base`` holds the record and the registry, ``importance``
registers is, wis, pdis and wpdis (in that order). Importing this package imports no JAX;
the kernel's reduction lives in ``estimators.batch``."""

from ope_cli.estimators import importance as _importance  # noqa: F401 - registers the four
from ope_cli.estimators.base import Estimator, get, names, register, title, unregister

__all__ = ["Estimator", "get", "names", "register", "title", "unregister"]
