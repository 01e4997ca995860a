"""Estimators as plug-ins: ``base`` holds the record and the registry, ``importance``
registers is, wis, pdis and wpdis (in that order), ``doubly_robust`` dm, dr and wdr
(computed when a run has a Q source). Importing this package imports no JAX;
the kernel's reduction lives in ``estimators.reduction``."""

from ope_cli.estimation.estimators import doubly_robust as _doubly_robust  # noqa: F401 - dm, dr, wdr
from ope_cli.estimation.estimators import importance as _importance  # noqa: F401 - registers the four
from ope_cli.estimation.estimators.base import (
    Estimator,
    available,
    get,
    names,
    register,
    title,
    unregister,
)

__all__ = ["Estimator", "available", "get", "names", "register", "title", "unregister"]
