"""Argument checks shared by the library: clear ValueErrors naming the argument."""
from __future__ import annotations

import math


def check_number(name: str, value, positive: bool = True, below: float | None = None) -> float:
    """``value`` as a finite float > 0 (``positive``) or >= 0, and < ``below`` if given."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > 0 if positive else value >= 0) and (below is None or value < below)
    if not ok:
        want = f"{'> 0' if positive else '>= 0'}" + ("" if below is None else f" and < {below}")
        raise ValueError(f"{name} must be a finite number {want}, got {value!r}")
    return float(value)


def check_positive_int(name: str, value) -> int:
    """``value`` as an int >= 1 (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
