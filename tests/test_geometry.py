"""One geometry (cassi.geometry.Geometry) for the operator, the camera, the simulator, the I/O fit check and the
models' check: its offsets and Δ, and every part agreeing with the operator on what it accepts and what y's shape is."""
import math

import pytest
import torch

from cassi import CASSI
from cassi.geometry import Geometry
from cassi.io import DataFileError, check_mask_fits
from cassi.models.camera import check_geometry
from cassi.physics import Camera, Simulator

H, W = 6, 11


def test_offsets_are_normalised_snapped_and_split_and_delta_is_their_ceiling():
    g = Geometry([2.5, 3.0, 5.7, 3.5000000004])
    assert g.offsets == pytest.approx((0.0, 0.5, 3.2, 1.0)) and g.offsets[3] == 1.0 and g.delta == 4
    assert g.shifts == (0, 0, 3, 1) and g.fracs == pytest.approx((0.0, 0.5, 0.2, 0.0)) and not g.integer
    assert Geometry.of(28, 2).delta == 54 and Geometry.of(28, 2).step == 2 and Geometry.of(4, 1.5).step is None
    assert Geometry.of(28, 0.1).delta == 3  # 27·0.1 = 2.7000000000000002
    assert Geometry((1, 2, 3)) == Geometry((0, 1, 2)) != Geometry((0, 1, 2), "h")
    assert Geometry.of(4, 3, axis="h").measurement_shape((H, W)) == (H + 9, W)
    assert Geometry.of(4, 3).measurement_shape((2, H, W)) == (H, W + 9)
    assert Geometry.of(4, 3, axis="h").along((5, H, W)) == H and Geometry.of(4, 3).with_width(W).out_width == W + 9


def test_a_record_round_trips_and_matches_within_a_tolerance():
    g = Geometry.of(5, 1.5, axis="h")
    assert g.record() == {"offsets": [0.0, 1.5, 3.0, 4.5, 6.0], "axis": "h", "bands": 5}
    assert Geometry.from_record(g.record()) == g and g.matches(g.with_width(9))
    assert g.matches(Geometry([0, 1.50001, 3, 4.5, 6], "h")) and not g.matches(Geometry([0, 1.6, 3, 4.5, 6], "h"))
    assert not g.matches(Geometry.of(5, 1.5)) and not g.matches(Geometry.of(4, 1.5, axis="h"))


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(bands=3, step=0), r"step must be a finite number > 0 \(pixels per band\), got 0"),
    (dict(bands=3, step=-1), "step must be"),
    (dict(bands=3, step=math.nan), "step must be"),
    (dict(bands=3, step=True), "step must be"),
    (dict(step=2), "needs bands"),
    (dict(bands=3, step=1, offsets=[0, 1, 2]), "either step= or offsets=, not both"),
    (dict(bands=3, offsets=[0, 1]), "offsets has length 2 but bands=3"),
    (dict(offsets=[]), "offsets must not be empty"),
    (dict(offsets=[0, math.inf]), "offsets must be finite"),
    (dict(bands=3, step=1, axis="x"), "axis must be 'w' or 'h', got 'x'"),
    (dict(bands=3, step=1, width=0), "width must be a positive integer"),
])
def test_a_geometry_no_operator_can_use_is_refused(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        Geometry.of(**kwargs)


# ----------------------------------------------------------------------------- every part agrees with the operator
DISPERSIONS = [
    dict(step=2), dict(step=1.5), dict(step=0.1), dict(step=2, axis="h"),
    dict(offsets=[1.0, 2.0, 3.5, 6.0]),  # the smallest offset above 0: I/O once said W + 6, the operator W + 5
    dict(offsets=[3.0, 1.0, 0.5, 2.2]), dict(offsets=[-2.0, 0.0, 1.0, 2.0]), dict(offsets=[0.4, 0.4, 0.4, 0.4]),
    dict(offsets=[1.0, 2.0, 3.0, 4.0], axis="h"),
]


@pytest.mark.parametrize("dispersion", DISPERSIONS)
def test_the_io_fit_check_accepts_exactly_the_operators_measurement(dispersion):
    axis = dispersion.get("axis", "w")
    op = CASSI(torch.ones(4, H, W), backend="loop", **dispersion)
    spec = dispersion.get("offsets", dispersion.get("step"))
    assert check_mask_fits((4, H, W), op.y_shape, spec, axis) == op.y_shape[1:]
    for grown in ((0, 1), (1, 0), (0, -1)):
        other = tuple(n + d for n, d in zip(op.y_shape[1:], grown))
        with pytest.raises(DataFileError, match="does not fit"):
            check_mask_fits((4, H, W), other, spec, axis)


@pytest.mark.parametrize("spec", [
    dict(step=0), dict(step=-2), dict(step=math.inf), dict(step=True), dict(step=2, axis="x"),
    dict(step=None, offsets=[0.0, math.nan, 1.0, 2.0]), dict(step=None, offsets=[0.0, 1.0]),
    *[{"step": None, **d} if "offsets" in d else d for d in DISPERSIONS],
])
def test_the_camera_accepts_what_the_operator_accepts_and_hands_out_its_geometry(spec):
    def build(make):
        try:
            return make()
        except ValueError as e:
            return e

    op = build(lambda: CASSI(torch.ones(H, W), bands=4, backend="loop", **spec))
    cam = build(lambda: Camera(masks="bernoulli", bands=4, wavelengths=None, **spec))
    assert isinstance(op, ValueError) == isinstance(cam, ValueError), (op, cam)  # Camera took step=0 once
    if isinstance(op, ValueError):
        assert str(cam).startswith("camera.") and "\n" not in str(cam)
        return
    assert cam.geometry.matches(op.geometry) and cam.operator(torch.ones(H, W)).geometry == op.geometry
    sim = cam.simulator(backend="loop")
    assert sim.geometry == cam.geometry
    assert sim({"x": torch.rand(2, 4, H, W)})["y"].shape[1:] == op.y_shape


def test_a_simulator_without_a_band_count_takes_it_from_the_scenes():
    sim = Simulator(torch.ones(H, W), step=1.5, backend="loop")
    assert sim.geometry is None and sim.operator(torch.ones(1, 1, H, W), 5).geometry == Geometry.of(5, 1.5, width=W)
    assert sim({"x": torch.rand(1, 3, H, W)})["y"].shape == (1, 1, H, W + 3)


class _Model:
    bands, source = 4, "m.ckpt"

    def __init__(self, geometry):
        self.geometry = geometry


def test_the_models_check_asks_the_geometry():
    op = CASSI(torch.ones(H, W), bands=4, step=2, backend="loop")
    check_geometry(_Model(op.geometry.record()), op)
    check_geometry(_Model({"offsets": [1.00001, 3, 5, 7], "axis": "w"}), op)  # normalised, within 1e-4 px
    check_geometry(_Model({"offsets": None, "axis": "w"}), op)
    with pytest.raises(ValueError, match=r"m.ckpt was trained for dispersion offsets \[0, 1, 2, 3\] along 'w'"):
        check_geometry(_Model({"offsets": [0, 1, 2, 3], "axis": "w"}), op)
    with pytest.raises(ValueError, match="along 'h'"):
        check_geometry(_Model({"offsets": None, "axis": "h"}), op)
    with pytest.raises(ValueError, match="reconstructs 4 bands but the operator has 5"):
        check_geometry(_Model(None), CASSI(torch.ones(H, W), bands=5, backend="loop"))


def test_the_operator_takes_a_geometry_instead_of_step_offsets_axis():
    g = Geometry.of(4, 1.5, axis="h")
    op = CASSI(torch.ones(H, W), geometry=g, backend="loop")
    assert op.geometry == g.with_width(H) and op.y_shape == (1, H + 5, W) and op.offsets == [0.0, 1.5, 3.0, 4.5]
    with pytest.raises(ValueError, match="geometry= replaces step=, offsets= and axis="):
        CASSI(torch.ones(H, W), geometry=g, step=2)
    with pytest.raises(ValueError, match="the geometry has 4 bands but the mask or bands= has 5"):
        CASSI(torch.ones(5, H, W), geometry=g)
