"""The dispersion geometry: where each band lands on the detector and how much wider y is than x.

Band c lands d_c px along ``axis`` ("w" or "h"); offsets are shifted so that min d = 0 (those within 1e-6 of an
integer snapped to it), and y grows by Δ = ceil(max d) px along that axis: a frame (H, W) gives a measurement
(H, W + Δ) or (H + Δ, W). d_c = k_c + f_c splits into an integer shift k_c and a fraction f_c ∈ [0, 1) for the
backends, which see the dispersed axis last, ``width`` px long.

One object for all who need it: the operator and its backends, the camera and the simulator
(:mod:`cassi.physics`), the check that a measurement file fits a mask (:func:`cassi.io.check_mask_fits`), a
checkpoint's record and a model's check against it (:mod:`cassi.models.camera`). It imports nothing but the
standard library, so that ``cassi.io``, below the physics, uses it too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

__all__ = ["Geometry"]

SNAP = 1e-6  # offsets this close to an integer are taken as that integer
AXES = ("w", "h")


def _floats(values) -> list[float]:
    return [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


@dataclass(frozen=True)
class Geometry:
    """Per-band offsets d (px, normalised to min d = 0) along ``axis``, and Δ = ceil(max d), computed here only.

    Args:
        offsets: d_c for every band, in any order, fractional allowed (a sequence, array or tensor).
        axis: "w" (along the width) or "h" (along the height).
        width: the frame's length along ``axis`` (the operator's; the backends need it), or None.

    Derived once: ``delta`` Δ, ``shifts`` k_c = floor(d_c), ``fracs`` f_c = d_c − k_c. Equal geometries (same
    offsets, axis and width) hash alike, so backends key their caches on them.
    """

    offsets: tuple[float, ...]
    axis: str = "w"
    width: int | None = None
    delta: int = field(init=False, compare=False)
    shifts: tuple[int, ...] = field(init=False, compare=False, repr=False)
    fracs: tuple[float, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self):
        offs = _floats(self.offsets)
        if not offs:
            raise ValueError("offsets must not be empty")
        if not all(math.isfinite(o) for o in offs):
            raise ValueError(f"offsets must be finite, got {offs}")
        if self.axis not in AXES:
            raise ValueError(f"axis must be 'w' or 'h', got {self.axis!r}")
        w = self.width
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"width must be a positive integer (px), got {w!r}")
        lo = min(offs)
        offs = [o - lo for o in offs]
        offs = tuple(float(round(o)) if abs(o - round(o)) < SNAP else o for o in offs)
        shifts = tuple(math.floor(o) for o in offs)
        set_ = object.__setattr__  # frozen: the derived fields are set once, here
        set_(self, "offsets", offs)
        set_(self, "delta", math.ceil(max(offs)))
        set_(self, "shifts", shifts)
        set_(self, "fracs", tuple(o - k for o, k in zip(offs, shifts)))

    @classmethod
    def of(cls, bands: int | None = None, step: float | None = None, offsets: Sequence[float] | None = None,
           axis: str = "w", width: int | None = None) -> Geometry:
        """A linear prism, d_c = c·``step`` for c < ``bands`` (step > 0, fractional allowed), or per-band
        ``offsets`` (exclusive with ``step``; their count checked against ``bands`` when given)."""
        if offsets is not None:
            if step is not None:
                raise ValueError("give either step= or offsets=, not both")
            offs = _floats(offsets)
            if bands is not None and len(offs) != bands:
                raise ValueError(f"offsets has length {len(offs)} but bands={bands}")
            return cls(tuple(offs), axis, width)
        if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
            raise ValueError(f"a dispersion step needs bands, a positive integer (or give offsets); got {bands!r}")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
            raise ValueError(f"step must be a finite number > 0 (pixels per band), got {step!r}")
        return cls(tuple(c * float(step) for c in range(bands)), axis, width)

    @classmethod
    def from_record(cls, record: dict) -> Geometry:
        """The geometry of a checkpoint's record {"offsets", "axis", ...} (:meth:`record`)."""
        return cls(tuple(record["offsets"]), record.get("axis") or "w")

    def record(self) -> dict:
        """{"offsets": [...], "axis", "bands"}: plain data, as checkpoints store it."""
        return {"offsets": list(self.offsets), "axis": self.axis, "bands": self.bands}

    # ------------------------------------------------------------------ sizes
    @property
    def bands(self) -> int:
        """C, the number of bands."""
        return len(self.offsets)

    def along(self, shape: Sequence[int]) -> int:
        """The length of a (…, H, W) ``shape`` along the dispersion axis: W for "w", H for "h"."""
        return shape[-1] if self.axis == "w" else shape[-2]

    def with_width(self, width: int) -> Geometry:
        """This geometry on frames ``width`` px long along the axis."""
        return replace(self, width=width)

    def measurement_shape(self, frame: Sequence[int]) -> tuple[int, int]:
        """(H, W + Δ) along "w", (H + Δ, W) along "h", of a frame (…, H, W)."""
        h, w = frame[-2:]
        return (h, w + self.delta) if self.axis == "w" else (h + self.delta, w)

    @property
    def out_width(self) -> int:
        """width + Δ: the measurement's length along the axis."""
        return self.width + self.delta

    # ------------------------------------------------------------------ kinds
    @property
    def integer(self) -> bool:
        """Every offset is a whole number of pixels."""
        return not any(self.fracs)

    @property
    def step(self) -> int | None:
        """The integer step S ≥ 1 when d_c = c·S for every band, else None."""
        if not self.integer:
            return None
        s = self.shifts[1] - self.shifts[0] if self.bands > 1 else 1
        if s <= 0 or any(k != c * s for c, k in enumerate(self.shifts)):
            return None
        return s

    def matches(self, other: Geometry, tol: float = 1e-4) -> bool:
        """The same dispersion as ``other``: axis, band count and offsets within ``tol`` px (widths aside)."""
        return (self.axis == other.axis and self.bands == other.bands
                and all(abs(a - b) < tol for a, b in zip(self.offsets, other.offsets)))
