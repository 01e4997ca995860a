"""Number formatting shared by every formatter (table, JSON, CSV, inspect, bench, plots).

Text helpers take ``None`` (an undefined number) and print ``missing`` instead ("n/a" in
the evaluate and inspect tables, "-" in the bench tables); ``json_number`` turns NaN and
inf into None, which JSON writes as null (the spec forbids NaN in the output).
"""

from __future__ import annotations

import math
from typing import Any

from ope_cli._version import __version__
from ope_cli.estimation.estimators import title

MISSING = "n/a"
SCHEMA_VERSION = 1  # of the commands' JSON reports (bench's has its own)


def document_header(command: str | None = None) -> dict[str, Any]:
    """The keys the JSON report of evaluate, inspect, convert, fit-q and fit-behavior starts
    with: schema_version and tool (SPEC 5) and, but in evaluate's (SPEC 5's document has
    none), the command that wrote it. (bench's has a schema_version of its own; generate
    prints its truth.json.)"""
    header: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ope", "version": __version__},
    }
    if command is not None:
        header["command"] = command
    return header


_SI_PREFIXES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def estimator_title(name: str) -> str:
    """The display name of an estimator, from its registration: "wis" -> "WIS"."""
    return title(name)


def json_number(x: float | None) -> float | None:
    """A JSON-safe number: NaN and inf become None (null)."""
    return x if x is not None and math.isfinite(x) else None


def beside(x: float, limit: float | None, digits: int, rounded) -> int:
    """The fewest digits, at least ``digits``, at which ``rounded(x, digits)`` stays on x's
    side of ``limit`` (a warning's threshold): an ESS share of 0.09996 printed "10.0%" in a
    warning that it is below 10%. ``digits`` itself without a limit or at it."""
    if limit is None or x == limit or not math.isfinite(x):
        return digits
    below = x < limit
    for more in range(digits, digits + 17):
        shown = rounded(x, more)
        if shown != limit and (shown < limit) == below:
            return more
    return digits + 17


def significant(
    x: float | None, digits: int = 4, missing: str = MISSING, limit: float | None = None
) -> str:
    """``digits`` significant digits: 0.123456 -> "0.1235", 1234567 -> "1.235e+06"; more
    where fewer would round onto or across ``limit`` (``beside``)."""
    if x is None:
        return missing
    digits = beside(x, limit, digits, lambda v, d: float(format(v, f".{d}g")))
    return format(x, f".{digits}g")


def resolved(x: float | None, spread: float | None, digits: int = 4, missing: str = MISSING) -> str:
    """``x`` to the place of ``spread``'s second significant digit (its standard error, say),
    and to at least ``digits`` significant digits: 1000.00469 with a spread of 0.00035 ->
    "1000.0047", where 4 digits alone print "1000" (and a real interval as [1000, 1000])."""
    if x is None:
        return missing
    if spread is None or not math.isfinite(spread) or spread <= 0 or not math.isfinite(x):
        return significant(x, digits)
    place = math.floor(math.log10(spread)) - 1
    magnitude = math.floor(math.log10(abs(x))) if x else place
    needed = min(magnitude - place + 1, 17)
    if needed <= digits:
        return significant(x, digits)
    return format(x, f"#.{needed}g").rstrip(".")  # its zeros too: 1000.00400, not 1000.004


def level(confidence: float) -> str:
    """A confidence level as a percentage with the digits it has: 0.95 -> "95%", 0.999 ->
    "99.9%" (not "100%")."""
    return f"{float(f'{confidence * 100:.10g}'):g}%"


def fixed(
    x: float | None, decimals: int = 1, missing: str = MISSING, limit: float | None = None
) -> str:
    """``decimals`` digits after the point: 12.345 -> "12.3"; more where fewer would round
    onto or across ``limit`` (``beside``)."""
    if x is None:
        return missing
    decimals = beside(x, limit, decimals, lambda v, d: float(format(v, f".{d}f")))
    return format(x, f".{decimals}f")


def percent(
    x: float | None, decimals: int = 1, missing: str = MISSING, limit: float | None = None
) -> str:
    """A fraction as a percentage: 0.1234 -> "12.3%"; never rounded to 0% or 100% when it is
    neither (0.9995 printed "100.0%", as a share that is all): "> 99.9%", "< 0.1%"; nor onto
    or across ``limit`` (``beside``)."""
    if x is None:
        return missing
    decimals = beside(x, limit, decimals, lambda v, d: float(format(v, f".{d}%")[:-1]) / 100)
    step = 10.0 ** -(decimals + 2)  # the last printed digit, as a fraction
    if 0 < x < step / 2:
        return f"< {step:.{decimals}%}"
    if 1 - step / 2 <= x < 1:
        return f"> {1 - step:.{decimals}%}"
    return format(x, f".{decimals}%")


def from_log(log_x: float | None, digits: int = 4, missing: str = MISSING) -> str:
    """exp(``log_x``) to ``digits`` significant digits, also where it underflows or
    overflows float64: -801 -> "1.349e-348" (exp gives 0.0), -inf -> "0"."""
    if log_x is None:
        return missing
    if log_x == -math.inf:
        return "0"
    if abs(log_x) < 700:
        return significant(math.exp(log_x), digits)
    log10 = log_x / math.log(10)
    exponent = math.floor(log10)
    mantissa = float(f"{10 ** (log10 - exponent):.{digits - 1}f}")
    if mantissa >= 10:  # 9.9996 rounded to 10.000
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.{digits}g}e{exponent:+d}"


def discount(gamma: float) -> str:
    """A discount with every digit it has: 0.9999999 printed "1" at 6 significant digits,
    and gamma = 1 (undiscounted) has its own meaning and warning."""
    text = repr(float(gamma))  # the shortest that reads back as gamma
    return text.removesuffix(".0")


def scientific(x: float | None, digits: int = 2, missing: str = MISSING) -> str:
    """Scientific notation with ``digits`` decimals: 0.000123 -> "1.23e-04"."""
    return missing if x is None else format(x, f".{digits}e")


def si(x: float | None, unit: str = "", missing: str = MISSING) -> str:
    """Three significant digits with an SI prefix: 1234567, "steps/s" -> "1.23Msteps/s"."""
    if x is None:
        return missing
    for factor, prefix in _SI_PREFIXES:
        if abs(x) >= factor:
            return f"{x / factor:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def seconds(x: float | None, missing: str = MISSING) -> str:
    """A duration in seconds: 1.23456 -> "1.235 s", 123.4 -> "123.4 s"."""
    if x is None:
        return missing
    return f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def times(x: float | None, missing: str = MISSING) -> str:
    """A ratio as a factor: 12.345 -> "12.3x", 12345.6 -> "12,346x"."""
    if x is None:
        return missing
    return f"{x:,.3g}x" if x < 1000 else f"{x:,.0f}x"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator <= 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def count(n: int) -> str:
    """An integer count with thousands separators: 1234567 -> "1,234,567"."""
    return f"{n:,}"


def weight_label(log10_weight: float) -> str:
    """A weight given by its log10, in 3 significant digits: 2.0 -> "100"."""
    return significant(10.0**log10_weight, 3)
