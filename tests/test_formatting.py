"""``ope_cli.report.formatting``: the one number-formatting helper of every formatter."""

from __future__ import annotations

import math

from ope_cli.report import formatting as f


def test_missing_numbers():
    for text in (f.significant, f.fixed, f.percent, f.scientific, f.si, f.seconds, f.times):
        assert text(None) == "n/a"
        assert text(None, missing="-") == "-"


def test_significant_fixed_percent_scientific():
    assert f.significant(0.123456) == "0.1235"
    assert f.significant(1234567.0) == "1.235e+06"
    assert f.significant(2.0, 3) == "2"
    assert f.fixed(12.345) == "12.3"
    assert f.fixed(12.345, 2) == "12.35"
    assert f.percent(0.1234) == "12.3%"
    assert f.percent(0.5, 0) == "50%"
    assert f.scientific(0.000123) == "1.23e-04"


def test_si_seconds_times_ratio_count():
    assert f.si(1_234_567, "steps/s") == "1.23Msteps/s"
    assert f.si(2_500) == "2.5k"
    assert f.si(3.2e9) == "3.2G"
    assert f.si(12.0) == "12"
    assert f.seconds(1.23456) == "1.235 s"
    assert f.seconds(123.45) == "123.5 s"
    assert f.times(12.345) == "12.3x"
    assert f.times(12_345.6) == "12,346x"
    assert f.ratio(6.0, 3.0) == 2.0
    assert f.ratio(None, 3.0) is None and f.ratio(1.0, 0.0) is None
    assert f.count(1234567) == "1,234,567"


def test_json_numbers_and_labels():
    assert f.json_number(1.5) == 1.5
    assert f.json_number(None) is None
    assert f.json_number(math.nan) is None and f.json_number(-math.inf) is None
    assert f.weight_label(2.0) == "100"
    assert f.weight_label(-3.0) == "0.001"
    assert f.estimator_title("wpdis") == "WPDIS"


def test_resolved_reaches_the_spread_s_second_digit():
    assert f.resolved(1000.0046897, 0.00035278) == "1000.00469"
    assert f.resolved(1000.0040, 0.00035278) == "1000.00400"  # its zeros are digits too
    assert f.resolved(2.0, 0.3) == "2"  # at least 4 significant digits, as significant()
    assert f.resolved(0.123456, None) == "0.1235" == f.resolved(0.123456, 0.0)
    assert f.resolved(-5.2e-10, 1e-12) == "-5.2e-10"
    assert f.resolved(None, 1.0) == f.MISSING


def test_level_keeps_its_digits():
    assert [f.level(c) for c in (0.95, 0.999, 0.975, 0.001, 0.5)] == [
        "95%",
        "99.9%",
        "97.5%",
        "0.1%",
        "50%",
    ]


def test_a_share_is_never_rounded_to_none_or_all():
    """P(better) 0.9995 printed "100.0%", a zero-weight share of 0.9998 the same as one
    whose every weight is zero, an ESS share of 0.0002 "0.0%"."""
    assert f.percent(0.9995) == "> 99.9%" and f.percent(1.0) == "100.0%"
    assert f.percent(0.0002) == "< 0.1%" and f.percent(0.0) == "0.0%"
    assert f.percent(0.1234) == "12.3%" and f.percent(0.9994) == "99.9%"
    assert f.percent(None) == f.MISSING


def test_a_discount_is_printed_with_every_digit_it_has():
    """0.9999999 printed "gamma=1" at 6 significant digits; gamma = 1 has its own meaning."""
    assert f.discount(0.9999999) == "0.9999999"
    assert f.discount(1.0) == "1" and f.discount(0.95) == "0.95" and f.discount(0) == "0"


def test_a_number_beside_a_threshold_is_never_rounded_onto_or_across_it():
    """An ESS share of 0.09996 printed "10.0%" in a warning that it is below 10%, a share of
    0.5004 "50%" in one that it is above 50%, a mean weight of 0.49996 "0.5, far from 1":
    with a ``limit``, a number takes the digits that keep it on its own side."""
    assert f.percent(0.09996, limit=0.1) == "9.996%" and f.percent(0.09996) == "10.0%"
    assert f.percent(0.5004, 0, limit=0.5) == "50.04%" and f.percent(0.51, 0, limit=0.5) == "51%"
    assert f.percent(0.1, limit=0.1) == "10.0%" and f.percent(0.0312, limit=0.1) == "3.1%"
    assert f.significant(0.49996, 3, limit=0.5) == "0.49996"
    assert f.significant(2.0004, 3, limit=2.0) == "2.0004"
    assert f.significant(0.25, 3, limit=0.5) == "0.25"
    assert f.fixed(9.99, 1, limit=10.0) == "9.99" and f.fixed(9.99, 1) == "10.0"
    assert f.fixed(None, 1, limit=10.0) == f.MISSING


def test_a_number_given_by_its_log_is_printed_beyond_float64_s_range():
    """A log column's smallest probability e^-801 is 0.0 in float64: inspect printed 'min 0',
    which reads as a step the behavior policy could not take."""
    assert f.from_log(-801.0) == "1.349e-348" and f.from_log(800.0) == "2.726e+347"
    assert f.from_log(math.log(0.25)) == "0.25" and f.from_log(-math.inf) == "0"
    assert f.from_log(None) == f.MISSING
