"""Argument checks shared by the library: clear errors naming the argument (standard library only)."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


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


def check_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``: TypeError for a non-int (or a bool), ValueError below it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def size_pair(size) -> tuple[int, int]:
    """An int s (for s x s) or a pair (h, w) of ints >= 1, as (h, w)."""
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else size
    try:
        h, w = pair
        return check_int("size[0]", h), check_int("size[1]", w)
    except (TypeError, ValueError) as err:
        raise type(err)(f"size must be an int or a pair (h, w) of ints >= 1, got {size!r}") from None


def plain(v):
    """Plain Python data (dicts, lists, numbers, strings) of a constructor argument: sequences and mappings of
    any type (tuples, Hydra's ListConfig/DictConfig) become lists and dicts, so that a checkpoint holding
    the config loads with ``torch.load(weights_only=True)``."""
    if v is None or isinstance(v, (str, bytes, bool, int, float)):
        return v
    if isinstance(v, Mapping):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, Iterable):
        return [plain(x) for x in v]
    return v
