"""cassi.tiling: large frames reconstructed in overlapping tiles equal the whole-frame reconstruction."""
import pytest
import torch

import cassi.tiling as tiling
from cassi import CASSI
from cassi.data.synthetic import synthetic_cube
from cassi.physics.masks import bernoulli_mask
from cassi.solvers import GAPTV, PseudoInverse
from cassi.tiling import Tiled, tile_spans, tile_weights

H, W, C = 40, 200, 8  # Δ = 14 along the dispersed axis


def problem(axis="w", offsets=None):
    x = synthetic_cube(H, W, C, seed=1)[None]
    mask = bernoulli_mask(H, W, seed=2)
    if axis == "h":
        x, mask = x.transpose(-1, -2).contiguous(), mask.T.contiguous()
    geometry = {"offsets": offsets} if offsets else {"bands": C, "step": 2}
    op = CASSI(mask, axis=axis, backend="strided", **geometry)
    return op, op(x), x


@pytest.mark.parametrize("length,size,overlap", [(200, 80, 32), (660, 512, 32), (660, 512, 140), (1000, 96, 30),
                                                 (81, 80, 10), (80, 80, 10)])
def test_spans_cover_with_equal_tiles_and_the_overlap(length, size, overlap):
    margin = 7  # Δ: neighbours share overlap + 2Δ, as Tiled plans them along the dispersed axis
    spans = tile_spans(length, size, overlap + 2 * margin)
    assert spans[0][0] == 0 and spans[-1][1] == length
    assert len({b - a for a, b in spans}) == 1 and spans[0][1] - spans[0][0] <= size
    assert all(b0 - a1 >= overlap + 2 * margin for (_, b0), (a1, _) in zip(spans, spans[1:]))
    weights = tile_weights(length, spans, margin, overlap)
    total = torch.zeros(length, dtype=torch.float64)
    for (a, b), w in zip(spans, weights):
        total[a:b] += w
        if a > 0:  # an inner edge: the first Δ + overlap/4 px are discarded
            assert w[: margin + overlap // 4].eq(0).all()
    assert total.min() > 0 and total[: spans[1][0] if len(spans) > 1 else length].eq(1).all()


@pytest.mark.parametrize("axis,offsets", [("w", None), ("h", None), ("w", [0.0, 1.6, 3.1, 4.9, 6.2, 8.0, 9.7, 11.5])])
def test_tiled_pseudo_inverse_is_exact(axis, offsets):
    """A⁺ is local: each kept pixel of a tile sees only y entries the tile models exactly (module docstring),
    so the blend of tiles equals the whole-frame A⁺ y everywhere, for integer and fractional offsets."""
    op, y, _ = problem(axis, offsets)
    tiled = Tiled(PseudoInverse(), size=80, overlap=8)
    assert len(tiled.plan(op)[0 if axis == "h" else 1]) > 2
    torch.testing.assert_close(tiled(op, y).x, op.pinv(y), rtol=0, atol=1e-6)


@pytest.mark.parametrize("axis", ["w", "h"])
def test_tiled_gap_tv_matches_the_whole_frame_without_seams(axis, monkeypatch):
    """GAP-TV couples neighbours through its TV prior, so tiles differ from the whole frame only by what leaks
    across the discarded edge: below 1e-3 (0.1 % of the [0, 1] range) at every pixel, blend zones included
    (no seam). Without the Δ-pixel discard along the dispersed axis the difference is over 10× larger."""
    op, y, _ = problem(axis)
    solver = GAPTV(iters=20)
    whole = solver(op, y).x
    tiled = Tiled(solver, size=80, overlap=32)
    result = tiled(op, y)
    assert result.iterations == 20
    assert (result.x - whole).abs().max() < 1e-3
    keep_all = tiling.tile_weights
    monkeypatch.setattr(tiling, "tile_weights", lambda n, spans, margin, overlap: keep_all(n, spans, 0, overlap))
    assert (tiled(op, y).x - whole).abs().max() > 1e-2


def test_small_frames_pass_through_and_gt_and_masks_are_cropped():
    op, y, x = problem()
    seen = []

    def reconstructor(sub, yt, gt=None):
        seen.append((tuple(sub.mask.shape), tuple(yt.shape), tuple(gt.shape)))
        return sub.pinv(yt)

    out = Tiled(reconstructor, size=W)(op, y, gt=x)
    assert seen == [((1, 1, H, W), (1, 1, H, W + 14), (1, C, H, W))] and torch.equal(out.x, op.pinv(y))
    seen.clear()
    masks = torch.stack([bernoulli_mask(H, W, seed=s) for s in (3, 4)])[:, None]  # one mask per sample
    op2 = CASSI(masks, bands=C, step=2, backend="strided")
    x2 = x.expand(2, -1, -1, -1)
    out = Tiled(reconstructor, size=80, overlap=8)(op2, op2(x2), gt=x2)
    t = seen[0][0][-1]
    assert seen[0] == ((2, 1, H, t), (2, 1, H, t + 14), (2, C, H, t)) and out.x.shape == (2, C, H, W)
    torch.testing.assert_close(out.x, op2.pinv(op2(x2)), rtol=0, atol=1e-6)


def test_a_tile_that_sees_no_light_gives_zeros():
    mask = bernoulli_mask(H, W, seed=2)
    mask[:, 100:] = 0
    op = CASSI(mask, bands=C, step=2, backend="strided")
    y = op(synthetic_cube(H, W, C, seed=1)[None])
    out = Tiled(PseudoInverse(), size=64, overlap=8)(op, y).x
    torch.testing.assert_close(out, op.pinv(y), rtol=0, atol=1e-6)
    assert out[..., 140:].eq(0).all()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="size must be an integer >= 1"):
        Tiled(PseudoInverse(), size=0)
    with pytest.raises(ValueError, match="tile size 32 must exceed the overlap 32"):
        Tiled(PseudoInverse(), size=32, overlap=32)
    op, y, _ = problem()
    with pytest.raises(ValueError, match="tile size 40 must exceed the overlap 60"):  # 32 + 2Δ along w
        Tiled(PseudoInverse(), size=40, overlap=32)(op, y)
