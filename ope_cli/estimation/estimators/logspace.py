"""NumPy helpers for numbers kept as (value relative to a scale, log scale): finalisation."""

from __future__ import annotations

import math

import numpy as np

MAX_LOG_FLOAT64 = 709.7  # exp of more overflows float64


def finite(x: float | None) -> float | None:
    """x as a float, or None when it is None, NaN or infinite."""
    return float(x) if x is not None and math.isfinite(x) else None


def rescale(log_scale, new_log_scale):
    """exp(log_scale - new_log_scale), and 1 where both are equal (also both -inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(log_scale == new_log_scale, 1.0, np.exp(log_scale - new_log_scale))


def to_larger(log_a: np.ndarray, log_b: np.ndarray):
    """(max(log_a, log_b), rescale(log_a, max), rescale(log_b, max)) with one exponential
    per element: the larger side's factor is 1, the other's exp(-|log_a - log_b|)."""
    larger = np.maximum(log_a, log_b)
    with np.errstate(invalid="ignore"):  # -inf - -inf: equal, factor 1 on both sides
        other = np.where(log_a == log_b, 1.0, np.exp(-np.abs(log_a - log_b)))
    return larger, np.where(log_a >= log_b, 1.0, other), np.where(log_b >= log_a, 1.0, other)


def scaled(value: float, log_scale: float) -> float | None:
    """value * exp(log_scale) without overflowing on the way; None if the result is not finite."""
    if value == 0.0 or not math.isfinite(value):
        return 0.0 if value == 0.0 else None
    log_magnitude = math.log(abs(value)) + log_scale
    if log_magnitude > MAX_LOG_FLOAT64:
        return None
    return finite(math.copysign(math.exp(log_magnitude), value))


def scaled_array(values: np.ndarray, log_scale: float) -> np.ndarray:
    """values * exp(log_scale), NaN where that overflows float64 (or values are NaN)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        magnitude = np.log(np.abs(values)) + log_scale
        out = np.sign(values) * np.exp(np.minimum(magnitude, MAX_LOG_FLOAT64))
    return np.where(values == 0, 0.0, np.where(magnitude > MAX_LOG_FLOAT64, np.nan, out))
