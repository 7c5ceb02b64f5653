"""Checks of scalar parameters (a metric's or a decoder's): a real number in the allowed range, returned as a
float, or an error naming the parameter."""

from __future__ import annotations

import numbers

__all__ = ["check_positive", "check_nonnegative", "check_unit_interval"]


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a real number, but got {type(value).__name__}")
    value = float(value)
    if value != value:
        raise ValueError(f"Expected `{name}` to be a number, but got nan")
    return value


def check_positive(value, name: str) -> float:
    v = _number(value, name)
    if not (v > 0) or v == float("inf"):
        raise ValueError(f"Expected `{name}` to be a float > 0, but got {value}")
    return v


def check_nonnegative(value, name: str) -> float:
    v = _number(value, name)
    if not (v >= 0) or v == float("inf"):
        raise ValueError(f"Expected `{name}` to be a float >= 0, but got {value}")
    return v


def check_unit_interval(value, name: str) -> float:
    """A value in [0, 1)."""
    v = _number(value, name)
    if not (0 <= v < 1):
        raise ValueError(f"Expected `{name}` to be a float in [0, 1), but got {value}")
    return v
