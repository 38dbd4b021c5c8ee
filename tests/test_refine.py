"""Refiner (a learned correction of GAP-TV) and FirstIterates (its training windows of precomputed solver output)."""
import pytest
import torch

from cassi import CASSI
from cassi.data.datasets import SyntheticCubes
from cassi.data import FirstIterates
from cassi.models import Refiner, load_model
from cassi.models.refine import _scale, build_solver
from cassi.physics.simulate import BernoulliMasks, Simulator
from cassi.solvers import GAPTV, PseudoInverse

FAST_TV = {"_target_": "cassi.solvers.GAPTV", "iters": 5, "tv_weight": 0.2, "tv_iters": 2, "decay": 0.9}
PINV = {"_target_": "cassi.solvers.PseudoInverse"}


def tiny(stages=1, solver=FAST_TV, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = Refiner(bands=5, stages=stages, width=4, depth=2, solver=solver, **kwargs)
    for p in model.priors.parameters():  # away from the near-identity start, so that every stage acts
        p.data.add_(0.05 * torch.randn_like(p))
    return model


def random_op(batch, bands, h, w, seed=0, **geometry):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, 1, h, w, generator=g) > 0.4).float()
    return CASSI(mask, bands=bands, backend="strided", **geometry or {"step": 2}), torch.rand(batch, bands, h, w, generator=g)


@pytest.mark.parametrize("geometry", [dict(step=2), dict(step=1, axis="h"), dict(offsets=[0.0, 1.5, 2.25, 4.0, 5.5])],
                         ids=["step2", "step1-h", "fractional"])
def test_stages_start_from_the_solver_and_train_every_prior(geometry):
    op, x = random_op(2, 5, 13, 11, **geometry)
    y = op(x)
    model = tiny(stages=2)
    outs = model(op, y, return_stages=True)
    assert len(outs) == 3 and all(o.shape == x.shape for o in outs)
    assert torch.allclose(outs[0], GAPTV(**{k: v for k, v in FAST_TV.items() if k != "_target_"})(op, y).x)
    # stage k corrects x_{k-1} from what it leaves of y
    r1 = op.pinv(y - op(outs[1]))
    assert torch.allclose(outs[2], model.refine(outs[1], r1, stage=1), atol=1e-6)
    outs[-1].square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize("geometry", [dict(step=2), dict(offsets=[0.0, 1.5, 2.25, 4.0, 5.5])], ids=["step2", "fractional"])
def test_projected_stages_fit_the_measurement(geometry):
    """project=True: each stage's output x̃ + A⁺(y − A x̃) meets A x = y wherever Φ > 0, and the next stage
    corrects it from r̃ = A⁺(y − A x̃) (what the projection added)."""
    op, x = random_op(2, 5, 13, 11, **geometry)
    y = op(x)
    plain, proj = tiny(stages=2), tiny(stages=2)
    proj.project = True
    assert Refiner(bands=5, project=True).config["project"] is True  # stored in checkpoints
    with torch.no_grad():
        a, b = plain(op, y, return_stages=True), proj(op, y, return_stages=True)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], proj.refine(b[0], op.pinv(y - op(b[0])), stage=0))
        r1 = op.pinv(y - op(a[1]))
        torch.testing.assert_close(b[1], a[1] + r1)
        t2 = proj.refine(b[1], r1, stage=1)  # stage 2's correction before its projection
        torch.testing.assert_close(b[2], t2 + op.pinv(y - op(t2)))
        covered = (op.phi > 0).expand_as(y)
        for out, before in ((b[1], a[1]), (b[2], t2)):
            fit, miss = ((op(v) - y)[covered].abs().max() for v in (out, before))
            if "step" in geometry:  # integer shifts: A Aᵀ = diag(Φ), so the projection meets y exactly
                assert fit < 1e-4 * y.abs().max() and miss > 100 * fit, (fit, miss)
            else:  # two-tap shifts couple neighbouring columns: one projection step only brings x closer
                assert fit < miss, (fit, miss)


def test_brightness_equivariant_with_a_linear_solver():
    op, x = random_op(2, 5, 12, 12)
    model = tiny(stages=2, solver=PINV)
    with torch.no_grad():
        assert torch.allclose(model(op, 7.0 * op(x)), 7.0 * model(op, op(x)), rtol=1e-4, atol=1e-6)


def test_solver_specs():
    assert isinstance(build_solver(PINV), PseudoInverse)
    solver = GAPTV(iters=3)
    assert build_solver(solver) is solver
    with pytest.raises(ValueError, match="'cassi.solvers.Nope' is not a registered cassi class"):
        build_solver({"_target_": "cassi.solvers.Nope"})
    with pytest.raises(ValueError, match="not a registered"):  # importable, but not cassi's: not imported
        build_solver({"_target_": "torch.nn.Linear"})
    with pytest.raises(ValueError, match="'GAPNet' is cassi.models.unrolled.GAPNet, not a Solver"):
        build_solver({"_target_": "GAPNet"})
    with pytest.raises(ValueError, match="solver must be a dict"):
        Refiner(bands=5, solver="gap_tv")
    with pytest.raises(ValueError, match="_recursive_=False"):  # an object would not load with weights_only
        Refiner(bands=5, solver=GAPTV(iters=3))
    assert Refiner(bands=5).config["solver"]["_target_"] == "cassi.solvers.GAPTV"  # the shipped GAP-TV by default


class Counting:
    """A solver spec whose solver counts its calls (to see when the cache spares them)."""
    calls = 0

    def __init__(self):
        self.inner = PseudoInverse()

    def __call__(self, op, y):
        Counting.calls += 1
        return self.inner(op, y)


def pool(tmp_path=None, solver=PINV, n=3, size=24, patch=8, backend="strided", noise=None, **kw):
    sim = Simulator(BernoulliMasks(0.5), bands=5, step=1, backend=backend, noise=noise)
    return FirstIterates(SyntheticCubes(n, size, size, bands=5, seed=3), sim, solver, patch_size=patch,
                         samples_per_epoch=10, cache=None if tmp_path is None else tmp_path / "fi.pt",
                         **{"load": load_model, **kw})


def _locate(window, scenes):
    """(scene, top, left, flips) of a window among the scenes' x (any of the 4 flips)."""
    h, w = window.shape[-2:]
    for j, x in enumerate(scenes["x"].float()):
        for flips in ([], [-2], [-1], [-2, -1]):
            v = window.flip(flips) if flips else window
            for t in range(x.shape[-2] - h + 1):
                for l in range(x.shape[-1] - w + 1):
                    if torch.equal(x[:, t:t + h, l:l + w], v):
                        return j, t, l, flips
    return None


def test_windows_of_x_x0_r_cut_and_flipped_together():
    ds = pool(patch=8)
    s = ds.scenes
    assert s["x"].shape == (3, 5, 24, 24) and s["y"].shape == (3, 1, 24, 28) and s["x"].dtype == torch.float16
    for i in range(len(ds)):
        item = ds[i]
        assert item["x"].shape == item["x0"].shape == item["r"].shape == (5, 8, 8)
        j, t, l, flips = _locate(item["x"], s)
        assert flips in ([], [-2])  # never along the dispersion axis (w)
        for k in ("x0", "r", "mask"):
            want = s[k][j, :, t:t + 8, l:l + 8].float()
            assert torch.equal(item[k], want.flip(flips) if flips else want)
        assert torch.equal(item["scale"], s["scale"][j]) and item["name"] == s["names"][j]
    # the solver's output, and its scale from the whole scene
    op = ds.simulator.operator(s["mask"][:1], 5)
    x0 = op.pinv(s["y"][:1])
    assert torch.allclose(s["x0"][0].float(), x0[0], atol=2e-3, rtol=2e-3)
    assert torch.allclose(s["scale"][0], x0.mean() / 0.5)
    same, other = [ds[i]["x"] for i in range(3)], None
    assert all(torch.equal(a, ds[i]["x"]) for i, a in enumerate(same))  # seeded by (seed, epoch, index)
    ds.set_epoch(1)
    other = [ds[i]["x"] for i in range(3)]
    assert not all(torch.equal(a, b) for a, b in zip(same, other))


@pytest.mark.parametrize("axis", ["w", "h"])
def test_windows_carry_the_measurement_noise_over_their_own_measurement(axis):
    """A window's "noise" is the scene's y − A x over the window's own measurement (cut and flipped with x): its
    A x + noise is the scene's y wherever every band's contribution comes from inside the window."""
    from cassi.physics.noise import ShotNoise

    sim = Simulator(BernoulliMasks(0.5), bands=5, step=1, backend="strided", noise=ShotNoise(100), axis=axis)
    ds = FirstIterates(SyntheticCubes(3, 24, 24, bands=5, seed=3), sim, PINV, patch_size=8, samples_per_epoch=12)
    s = ds.scenes
    assert s["n"].shape == s["y"].shape and s["n"].float().std() > 0.02  # shot noise of 100 photons is there
    flipped = 0
    for i in range(len(ds)):
        item = ds[i]
        j, t, l, flips = _locate(item["x"], s)
        flipped += bool(flips)
        assert item["noise"].shape == ((1, 8, 12) if axis == "w" else (1, 12, 8))
        op = sim.operator(item["mask"][None], 5)
        y = (op(item["x"][None]) + item["noise"][None])[0]
        y = y.flip(flips) if flips else y  # back to the scene's orientation
        full = s["y"][j, :, t:t + 8, l + 4:l + 8] if axis == "w" else s["y"][j, :, t + 4:t + 8, l:l + 8]
        inner = y[..., 4:8] if axis == "w" else y[..., 4:8, :]
        assert torch.allclose(inner, full, atol=2e-3), (i, (inner - full).abs().max())
    assert 0 < flipped < len(ds)


def test_a_pool_through_a_mixture_of_masks_is_found_again_by_a_new_process_and_not_by_another_mixture(
        tmp_path, monkeypatch):
    # the mixture is built anew in every process (fit_camera's stage 2, a resumed run): its sources have no
    # identity to share, only what they draw
    import cassi.data.first_iterates as refine
    from cassi.physics.simulate import BlockMasks, FixedMask, MixedMasks

    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    mask = torch.rand(24, 24, generator=torch.Generator().manual_seed(1))

    def mixed(p=0.4, m=mask):
        sim = Simulator(MixedMasks([FixedMask(m.clone()), BlockMasks([p, 0.6], block=2)]), bands=5, step=1)
        return FirstIterates(SyntheticCubes(3, 24, 24, bands=5, seed=3), sim, PINV, patch_size=8,
                             cache=tmp_path / "fi.pt")

    Counting.calls = 0
    a, b = mixed(), mixed()  # both alive: no address can be shared
    assert a._key() == b._key() and "object at" not in str(a._key())
    a.prepare()
    b.prepare()
    assert Counting.calls == 3
    mixed(p=0.3).prepare()          # another fill range: recomputed
    assert Counting.calls == 6
    mixed(p=0.3, m=1 - mask).prepare()   # another mask in the mixture: recomputed
    assert Counting.calls == 9


def test_cache_spares_the_solver_and_is_rebuilt_when_it_does_not_fit(tmp_path, monkeypatch):
    import cassi.data.first_iterates as refine

    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    Counting.calls = 0
    first = pool(tmp_path)
    first.prepare()
    assert Counting.calls == 3 and (tmp_path / "fi.pt").is_file()
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary file
    again = pool(tmp_path)
    again.prepare()
    assert Counting.calls == 3 and torch.equal(again.scenes["x0"], first.scenes["x0"])
    pool(tmp_path, backend="loop").prepare()     # another backend computes the same measurements: kept
    assert Counting.calls == 3
    pool(tmp_path, solver=FAST_TV).prepare()     # another solver: recomputed
    assert Counting.calls == 6
    pool(tmp_path, n=2).prepare()               # other scenes: recomputed
    assert Counting.calls == 8
    pool(tmp_path, n=2, seed=1).prepare()       # other masks (the dataset's seed): recomputed
    assert Counting.calls == 10
    pool(tmp_path, n=2, seed=1, size=20).prepare()   # other scene size: recomputed
    assert Counting.calls == 12
    pool(tmp_path, n=2, seed=1, size=20).prepare()
    assert Counting.calls == 12

    class Later(SyntheticCubes):  # the scenes' dataset after an option was added to it
        def __init__(self, *args, tint: float = 0.0, **kw):
            super().__init__(*args, **kw)
            self.tint = tint

    def later(tint):
        return FirstIterates(Later(2, 20, 20, bands=5, seed=3, tint=tint), Simulator(BernoulliMasks(0.5), bands=5,
                             step=1, backend="strided"), PINV, patch_size=8, samples_per_epoch=10, seed=1,
                             cache=tmp_path / "fi.pt")
    later(0.0).prepare()   # the new option at its default: the cache made before it still fits
    assert Counting.calls == 12
    later(0.5).prepare()   # set: other scenes, recomputed
    assert Counting.calls == 14
    (tmp_path / "fi.pt").write_bytes(b"truncated")
    pool(tmp_path, n=2).prepare()
    assert Counting.calls == 16


@pytest.mark.parametrize("stop", [KeyboardInterrupt, MemoryError, RuntimeError])
def test_a_stopped_pool_continues_from_its_pieces_and_equals_an_unstopped_one(tmp_path, monkeypatch, stop):
    import cassi.data.first_iterates as refine

    class Stopped(Counting):  # Ctrl-C, or a failure, during the 8th scene
        def __call__(self, op, y):
            if Counting.calls == 7:
                raise stop
            return super().__call__(op, y)

    monkeypatch.setattr(refine, "build_solver", lambda spec: Stopped())
    Counting.calls = 0
    with pytest.raises(stop):
        pool(tmp_path, n=25).prepare()   # a piece every 2 scenes: scenes 0–5 saved, the 7th lost
    parts = tmp_path / "fi.pt.parts"
    assert sorted(int(f.stem) for f in parts.glob("*.pt")) == [0, 2, 4] and not (tmp_path / "fi.pt").exists()
    (tmp_path / ".fi.pt.1a2b3c4d.tmp").write_bytes(b"a final write cut short by a kill")
    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    Counting.calls = 0
    resumed = pool(tmp_path, n=25)
    resumed.prepare()
    assert Counting.calls == 19 and not parts.exists() and (tmp_path / "fi.pt").is_file()
    assert not list(tmp_path.glob(".fi.pt.*.tmp"))
    parts.mkdir()  # left by a kill between the cache's write and the pieces' removal: removed when the cache is read
    (parts / "0.pt").write_bytes(b"")
    pool(tmp_path, n=25).prepare()
    assert Counting.calls == 19 and not parts.exists()
    whole = pool(tmp_path / "whole", n=25)
    whole.prepare()
    for k in ("x", "x0", "r", "y", "mask", "scale"):
        assert torch.equal(resumed.scenes[k], whole.scenes[k]), k
    assert resumed.scenes["names"] == whole.scenes["names"]
    # pieces of another pool (here: other masks) are not used
    monkeypatch.setattr(refine, "build_solver", lambda spec: Stopped())
    Counting.calls = 0
    with pytest.raises(stop):
        pool(tmp_path / "other", n=25).prepare()
    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    Counting.calls = 0
    pool(tmp_path / "other", n=25, seed=1).prepare()
    assert Counting.calls == 25 and not (tmp_path / "other" / "fi.pt.parts").exists()


def test_scenes_solved_together_equal_scenes_solved_one_by_one_and_resume_from_pieces(tmp_path, monkeypatch):
    # on a GPU the pool's solver runs on POOL_CHUNK scenes at once; each scene keeps its own mask and noise
    import cassi.data.first_iterates as refine

    one = pool(solver=FAST_TV, n=7).scenes
    monkeypatch.setitem(refine.POOL_CHUNK, "cpu", 3)
    together = pool(solver=FAST_TV, n=7).scenes
    assert not torch.equal(one["mask"][0], one["mask"][1])  # a mask per scene
    for k in ("x", "x0", "r", "y", "mask", "scale"):
        assert torch.allclose(together[k].float(), one[k].float(), atol=1e-6, rtol=1e-5), k
    assert together["names"] == one["names"]

    sizes = []

    class Stopped(Counting):  # a kill during the third solver call (scenes 6–8 of 25)
        def __call__(self, op, y):
            sizes.append(y.shape[0])
            if Counting.calls == 2 and len(sizes) == 3:
                raise KeyboardInterrupt
            return super().__call__(op, y)

    monkeypatch.setattr(refine, "build_solver", lambda spec: Stopped())
    Counting.calls = 0
    with pytest.raises(KeyboardInterrupt):
        pool(tmp_path, n=25).prepare()  # a piece when 2 or more scenes were solved since the last: 0–2, 3–5
    assert sorted(int(f.stem) for f in (tmp_path / "fi.pt.parts").glob("*.pt")) == [0, 3]
    resumed = pool(tmp_path, n=25)
    resumed.prepare()
    assert sizes == [3, 3, 3] + [3] * 6 + [1]  # scenes 6–24 solved again: 6 calls of 3 and one of 1
    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    whole = pool(tmp_path / "whole", n=25)
    for k in ("x", "x0", "r", "y", "mask", "scale"):
        assert torch.equal(resumed.scenes[k], whole.scenes[k]), k

    class Tolerant(Stopped):  # stops at a tolerance: on a batch, that would be the largest residual's
        tol = 1e-3

    sizes.clear()
    monkeypatch.setattr(refine, "build_solver", lambda spec: Tolerant())
    pool(n=4).prepare()
    assert sizes == [1, 1, 1, 1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="larger than the scenes"):
        pool(patch=32).prepare()
    with pytest.raises(ValueError, match="needs the 1 before it: give init_weights"):
        pool(stages=2)
    with pytest.raises(ValueError, match="loads init s1.ckpt: give load"):
        pool(stages=2, init="s1.ckpt", load=None)
    with pytest.raises(ValueError, match="samples_per_epoch >= 1"):
        pool(patch=0)
    with pytest.raises(IndexError):
        pool()[10]


def test_scenes_of_another_size_fail_before_the_solver_runs_on_them(tmp_path, monkeypatch):
    import cassi.data.first_iterates as refine

    class Mixed(torch.utils.data.Dataset):  # the third scene is larger
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"x": torch.rand(5, 24 if i < 2 else 28, 24), "name": f"s{i}"}

    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    Counting.calls = 0
    sim = Simulator(BernoulliMasks(0.5), bands=5, step=1, backend="strided")
    with pytest.raises(ValueError, match=r"one size.*scene 2 \(s2\) is \(5, 28, 24\).*scene 0 \(5, 24, 24\)"):
        FirstIterates(Mixed(), sim, PINV, patch_size=8, cache=tmp_path / "fi.pt").prepare()
    assert Counting.calls == 2 and not list(tmp_path.iterdir())  # no solver run on it, nothing written


def checkpoint(path, model, geometry=None):
    torch.save({"state_dict": {f"reconstructor.{k}": v for k, v in model.state_dict().items()},
                "cassi": {"model": model.config, "geometry": geometry, "wavelengths": None}}, path)
    return path


def test_stage_two_is_trained_on_the_output_of_stage_one(tmp_path):
    first = tiny(stages=1, solver=PINV)
    path = checkpoint(tmp_path / "s1.ckpt", first)
    base, ds = pool(), pool(stages=2, init=path)
    b, s = base.scenes, ds.scenes
    op = base.simulator.operator(b["mask"][:1], 5)
    with torch.no_grad():
        x1 = first.refine(b["x0"][:1].float(), b["r"][:1].float(), stage=0)
    r1 = op.pinv(b["y"][:1] - op(x1))
    assert torch.allclose(s["x0"][0].float(), x1[0], atol=2e-3, rtol=2e-3)
    assert torch.allclose(s["r"][0].float(), r1[0], atol=2e-3, rtol=2e-3)
    assert torch.allclose(s["scale"][0], x1.mean() / 0.5)
    assert not torch.equal(s["x0"], b["x0"])
    # a model of other stages cannot feed stage 3
    with pytest.raises(ValueError, match="stage 3 is trained on the output of stages 1..2"):
        pool(stages=3, init=path).prepare()


def test_projected_stage_one_feeds_stage_two(tmp_path):
    first = tiny(stages=1, solver=PINV)
    path = checkpoint(tmp_path / "s1.ckpt", first)
    base, ds = pool(), pool(stages=2, init=path, project=True)
    b, s = base.scenes, ds.scenes
    op = base.simulator.operator(b["mask"][:1], 5)
    with torch.no_grad():
        x1 = first.refine(b["x0"][:1].float(), b["r"][:1].float(), stage=0)
    r1 = op.pinv(b["y"][:1] - op(x1))
    assert torch.allclose(s["x0"][0].float(), (x1 + r1)[0], atol=2e-3, rtol=2e-3)  # stage 1 projected
    assert torch.allclose(s["r"][0].float(), r1[0], atol=2e-3, rtol=2e-3)


def test_more_stages_start_from_fewer_in_training(tmp_path):
    from cassi.lightning import TrainingModule

    one = tiny(stages=1)
    path = checkpoint(tmp_path / "s1.ckpt", one)
    two = Refiner(bands=5, stages=2, width=4, depth=2, solver=FAST_TV)
    TrainingModule(two, operator=None, init_weights=str(path))
    TrainingModule(Refiner(bands=5, stages=2, width=4, depth=2, solver=dict(FAST_TV, iters=9), project=True),
                   operator=None, init_weights=str(path))  # the first iterate and how stages chain: not in the weights
    assert all(torch.equal(a, b) for a, b in zip(two.priors[0].state_dict().values(), one.priors[0].state_dict().values()))
    # a wider U-Net starts as the checkpoint's (its new channels silent), a narrower one is refused
    wider = Refiner(bands=5, stages=2, width=8, depth=2, solver=FAST_TV)
    TrainingModule(wider, operator=None, init_weights=str(path))
    x = torch.rand(2, 10, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(wider.priors[0](x), one.priors[0](x), rtol=1e-5, atol=1e-6)
    assert wider.priors[0].last.weight.shape[1] == 8
    # a new stage may have its own U-Net shape; the stages taken from the checkpoint must keep theirs
    deeper = Refiner(bands=5, stages=2, width=[4, 6], depth=[2, 3], solver=FAST_TV)
    TrainingModule(deeper, operator=None, init_weights=str(path))
    assert all(torch.equal(a, b) for a, b in zip(deeper.priors[0].state_dict().values(),
                                                 one.priors[0].state_dict().values()))
    with pytest.raises(ValueError, match=r"depth per stage \(\[2\] there, \[3\] here\)"):
        TrainingModule(Refiner(bands=5, stages=2, width=4, depth=[3, 3], solver=FAST_TV), operator=None,
                       init_weights=str(path))
    with pytest.raises(ValueError, match=r"depth per stage \(\[2\] there, \[3\] here\)"):  # wider too: the same line
        TrainingModule(Refiner(bands=5, stages=2, width=8, depth=[3, 3], solver=FAST_TV), operator=None,
                       init_weights=str(path))
    path2 = checkpoint(tmp_path / "s2.ckpt", deeper)  # and fewer: the checkpoint's first stages
    first = Refiner(bands=5, stages=1, width=4, depth=2, solver=FAST_TV)
    TrainingModule(first, operator=None, init_weights=str(path2))
    assert all(torch.equal(a, b) for a, b in zip(first.priors[0].state_dict().values(),
                                                 deeper.priors[0].state_dict().values()))
    with pytest.raises(ValueError, match=r"width per stage \(not below the checkpoint's\) \(\[4\] there, \[3\] here\)"):
        TrainingModule(Refiner(bands=5, stages=1, width=3, depth=2, solver=FAST_TV), operator=None,
                       init_weights=str(path2))


@pytest.mark.parametrize("prior", ["mst", "hst"])
def test_an_attention_prior_trains_every_weight_and_loads_from_its_checkpoint(tmp_path, prior):
    """prior="mst" / "hst": each stage is MST's attention U-Net (cassi.models.zoo.mst.SpectralUNet) or DAUHST's
    half-shuffle transformer (cassi.models.zoo.dauhst.HSTPrior) on [x, r]; any frame size (padded inside),
    gradients reach every weight, a checkpoint gives the same model back; other names and widening its stages
    are refused."""
    from cassi.lightning import TrainingModule
    from cassi.models.zoo.dauhst import HSTPrior
    from cassi.models.zoo.mst import SpectralUNet

    model = tiny(stages=2, prior=prior)
    assert all(isinstance(net, {"mst": SpectralUNet, "hst": HSTPrior}[prior]) for net in model.priors)
    op, x = random_op(2, 5, *{"mst": (13, 11), "hst": (37, 35)}[prior])  # hst: a grid of windows to attend across
    out = model(op, op(x))
    assert out.shape == x.shape
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches {missing}"
    model.eval()
    loaded = load_model(checkpoint(tmp_path / "m.ckpt", model))
    assert loaded.config["prior"] == prior
    with torch.no_grad():
        assert torch.equal(loaded(op, op(x)), model(op, op(x)))
    with pytest.raises(ValueError, match=r"prior must be one of \['hst', 'mst', 'unet'\], got 'resnet'"):
        Refiner(bands=5, prior="resnet")
    wider = Refiner(bands=5, stages=2, width=8, depth=2, solver=FAST_TV, prior=prior)
    with pytest.raises(ValueError, match="only U-Net stages can be widened"):
        TrainingModule(wider, lambda mask: CASSI(mask, bands=5, step=2), init_weights=str(tmp_path / "m.ckpt"))


def test_per_stage_u_net_shapes():
    m = Refiner(bands=5, stages=3, width=[4, 4, 8], depth=[2, 2, 3], solver=FAST_TV)
    n = [sum(p.numel() for p in u.parameters()) for u in m.priors]
    assert n[0] == n[1] == sum(p.numel() for p in Refiner(bands=5, width=4, depth=2).priors[0].parameters())
    assert n[2] == sum(p.numel() for p in Refiner(bands=5, width=8, depth=3).priors[0].parameters())
    op, x = random_op(1, 5, 16, 16)
    assert m(op, op(x)).shape == x.shape
    with pytest.raises(ValueError, match=r"depth must be a positive int or a list of 3 \(one per stage\), got \[2, 2\]"):
        Refiner(bands=5, stages=3, depth=[2, 2])
    with pytest.raises(ValueError, match="width must be a positive int"):
        Refiner(bands=5, stages=1, width=0)


def test_training_step_on_windows_trains_the_last_stage(tmp_path):
    from cassi.lightning import TrainingModule

    model = tiny(stages=2, solver=PINV)
    module = TrainingModule(model, operator=lambda mask: CASSI(mask, bands=5, step=1))
    ds = pool()
    batch = {k: torch.stack([ds[i][k] for i in range(4)]) for k in ("x", "x0", "r", "scale")}
    loss = module.training_step(batch, 0)
    loss.backward()
    assert all(p.grad is None for p in model.priors[0].parameters())
    assert all(p.grad is not None for p in model.priors[1].parameters())
    assert module.geometry == {"offsets": [0.0, 1.0, 2.0, 3.0, 4.0], "axis": "w", "bands": 5}


def test_windows_of_first_iterates_are_refused_for_a_model_that_does_not_take_them():
    """The training module is model-agnostic: windows of first iterates go to the model's ``forward_windows``; a
    model without one (here GAP-Net), or stage weights beside them, is refused in one line naming it."""
    from cassi.lightning import TrainingModule
    from cassi.models import GAPNet

    batch = torch.utils.data.default_collate([pool()[i] for i in range(2)])
    op = lambda mask: CASSI(mask, bands=5, step=1)  # noqa: E731
    with pytest.raises(ValueError, match="train a model that takes them .* not GAPNet$"):
        TrainingModule(GAPNet(bands=5, stages=1, width=4, depth=2), operator=op).training_step(batch, 0)
    with pytest.raises(ValueError, match="not Refiner with stage_weights"):
        TrainingModule(tiny(), operator=op, stage_weights=[1.0]).training_step(batch, 0)


@pytest.mark.parametrize("project, ensemble, masked", [(False, False, False), (True, False, False), (True, True, False),
                                                       (True, True, True)])
def test_windows_of_the_first_iterates_train_every_stage_end_to_end(project, ensemble, masked):
    """Windows that feed stage 1 (a pool of 1 stage) train a 2-stage model end to end: stage 1 (plainly, even
    where the model has a mirror ensemble there for inference), its projection onto the window's y = A x + n (with
    project; n the scene's noise there), stage 2 on that and what it leaves of y, then the loss."""
    from cassi.lightning import TrainingModule
    from cassi.physics.noise import ShotNoise

    model = tiny(stages=2, solver=PINV, mask_input=masked)
    model.project, model.flip_ensemble = project, [0] if ensemble else False
    for p in model.parameters():  # far from identity: a projection would hide how stage 2's input was made
        p.data.add_(0.3 * torch.randn_like(p))
    module = TrainingModule(model, operator=lambda mask: CASSI(mask, bands=5, step=1))
    ds = pool(noise=ShotNoise(100))
    items = [ds[i] for i in range(4)]
    assert {item["stage"] for item in items} == {0}
    batch = torch.utils.data.default_collate(items)
    loss = module.training_step(batch, 0)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    op, x, s = CASSI(batch["mask"], bands=5, step=1), batch["x"], batch["scale"]
    with torch.no_grad():
        x0, r0, y = batch["x0"], batch["r"], op(x) + batch["noise"]
        m = batch["mask"] if masked else None
        x1 = model.refine(x0, r0, s, stage=0, mask=m)  # no mirror ensemble in training
        r1 = op.pinv(y - op(x1))
        x2 = model.refine(x1 + r1 if project else x1, r1, s, stage=1, mask=m)
        want = x2 + op.pinv(y - op(x2)) if project else x2
        without = dict(batch, noise=torch.zeros_like(batch["noise"]))  # what the noise changes is trained
        assert not torch.allclose(model.forward_windows(without, module.operator), want, atol=1e-3)
        assert torch.allclose(model.forward_windows(batch, module.operator), want, atol=1e-5)
        assert torch.allclose(loss, module.loss(want, x), atol=1e-6)
        # windows that feed stage 2 (the default without "stage") train stage 2 alone, as before
        last = dict(batch, stage=torch.ones_like(batch["stage"]))
        assert torch.allclose(module.training_step(last, 0), module.training_step(
            {k: v for k, v in last.items() if k != "stage"}, 0))
        with pytest.raises(ValueError, match="windows feed stage 3 but the model has 2 stage"):
            module.training_step(dict(batch, stage=torch.full_like(batch["stage"], 2)), 0)


def test_projected_refiner_trains_on_its_projected_windows():
    """project=True: the loss sees the stage's output after the window's projection x̃ + A⁺(A x − A x̃)."""
    from cassi.lightning import TrainingModule

    model = tiny(stages=1, solver=PINV)
    model.project = True
    module = TrainingModule(model, operator=lambda mask: CASSI(mask, bands=5, step=1))
    ds = pool()
    batch = {k: torch.stack([ds[i][k] for i in range(4)]) for k in ("x", "x0", "r", "scale", "mask")}
    op, x = CASSI(batch["mask"], bands=5, step=1), batch["x"]
    with torch.no_grad():
        out = model.refine(batch["x0"], batch["r"], batch["scale"])
        want = module.loss(out + op.pinv(op(x) - op(out)), x)
        assert torch.allclose(module.training_step(batch, 0), want)
        model.project = False
        assert torch.allclose(module.training_step(batch, 0), module.loss(out, x))
        assert not torch.allclose(want, module.loss(out, x))


def test_loads_from_a_checkpoint_with_its_solver(tmp_path):
    model = tiny(stages=2).eval()
    loaded = load_model(checkpoint(tmp_path / "m.ckpt", model))
    assert type(loaded) is Refiner and loaded.stages == 2 and loaded.config["solver"] == FAST_TV
    op, x = random_op(1, 5, 12, 12)
    with torch.no_grad():
        assert torch.equal(loaded(op, op(x)), model(op, op(x)))


def test_under_ddp_one_process_computes_the_pool_and_the_other_ranks_load_it(tmp_path, monkeypatch):
    """Lightning calls prepare_data on one process per node, then setup on every rank."""
    import cassi.data.first_iterates as refine
    from cassi.lightning.datamodule import CASSIDataModule

    monkeypatch.setattr(refine, "build_solver", lambda spec: Counting())
    Counting.calls = 0
    rank0, rank1 = CASSIDataModule(train=pool(tmp_path)), CASSIDataModule(train=pool(tmp_path))
    rank0.prepare_data()
    assert Counting.calls == 3 and (tmp_path / "fi.pt").is_file()
    rank0.setup("fit")
    rank1.setup("fit")
    assert Counting.calls == 3
    assert torch.equal(rank1.datasets["train"].scenes["x0"], rank0.datasets["train"].scenes["x0"])


@pytest.mark.parametrize("geometry", [dict(step=2), dict(step=1, axis="h")], ids=["step2", "step1-h"])
@pytest.mark.parametrize("project", [False, True])
@pytest.mark.parametrize("which", [True, [0]], ids=["all", "stage0"])
def test_flip_ensemble_averages_stages_over_the_mirror_across_the_dispersion(geometry, project, which):
    """flip_ensemble: stage k's correction is the mean of refine(x, r) and the mirror of refine on the mirrored
    (x, r), mirrored across the dispersion axis (h for dispersion along w, w for along h), with x's own scale;
    True: every stage, a list: those stages only."""
    op, x = random_op(2, 5, 12, 10, **geometry)
    y = op(x)
    model = tiny(stages=2)
    model.project = project
    ens = tiny(stages=2)
    ens.project, ens.flip_ensemble = project, which
    assert Refiner(bands=5, stages=2, flip_ensemble=which).config["flip_ensemble"] == which  # in checkpoints
    dim = -1 if geometry.get("axis") == "h" else -2

    def mirrored(x, r, stage):
        s = x.mean(dim=(1, 2, 3), keepdim=True) / 0.5
        return 0.5 * (model.refine(x, r, stage=stage) + model.refine(x.flip(dim), r.flip(dim), s, stage).flip(dim))

    with torch.no_grad():
        a, b = model(op, y, return_stages=True), ens(op, y, return_stages=True)
        assert torch.equal(a[0], b[0])
        x0, r0 = b[0], op.pinv(y - op(b[0]))
        t1 = mirrored(x0, r0, 0)
        r1 = op.pinv(y - op(t1))
        torch.testing.assert_close(b[1], t1 + r1 if project else t1)
        assert (b[1] - a[1]).abs().max() > 1e-3  # the mirrored pass changes the result (a non-symmetric U-Net)
        t2 = mirrored(b[1], r1, 1) if which is True else model.refine(b[1], r1, stage=1)
        torch.testing.assert_close(b[2], t2 + op.pinv(y - op(t2)) if project else t2)


@pytest.mark.parametrize("bad", [[2], [-1], ["0"], [True], "yes", 1])
def test_flip_ensemble_refuses_what_is_not_a_stage_list(bad):
    with pytest.raises(ValueError, match="flip_ensemble must be true, false or a list of stages in 0..1"):
        Refiner(bands=5, stages=2, flip_ensemble=bad)


def test_mask_input_reads_the_operators_mask():
    """mask_input: each U-Net reads [x/s, r/s, M]; the whole-scene forward (here with the flip ensemble) takes M from
    the operator, another mask gives another correction, and a call without the mask is refused. (Windows with
    their own crop of the mask: test_windows_of_the_first_iterates_train_every_stage_end_to_end.)"""
    model = tiny(mask_input=True, flip_ensemble=True)
    assert sum(p.numel() for p in model.parameters()) > sum(p.numel() for p in tiny().parameters())
    op, x = random_op(1, 5, 16, 16)
    y = op(x)
    with torch.no_grad():
        x0, r0 = model.first(op, y)
        whole = model(op, y)
        s = _scale(x0)
        direct = model.correct(x0, r0, 0, op.axis, s, op.mask)
        torch.testing.assert_close(whole, direct)
        other = model.correct(x0, r0, 0, op.axis, s, 1 - op.mask)  # another mask: another correction
        assert (other - whole).abs().max() > 1e-4
    with pytest.raises(ValueError, match="mask_input=true.*needs the mask"):
        model.refine(x0, r0, s)


def test_spectral_interp_is_linear_interpolation_clamped_at_the_ends():
    from cassi.models.refine import spectral_interp

    src = torch.tensor([450.0, 500.0, 600.0])
    q = spectral_interp(src, [400.0, 450.0, 475.0, 550.0, 700.0])
    line = 2 * src + 1  # a spectrum linear in λ is reproduced inside the grid, held at the end bands outside it
    assert torch.allclose(q @ line.double(), torch.tensor([901.0, 901.0, 951.0, 1101.0, 1201.0], dtype=torch.float64))
    assert torch.allclose(q.sum(1), torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="src increasing"):
        spectral_interp([500.0, 450.0], [470.0])


@pytest.mark.parametrize("prior", ["unet", "mst", "hst"])
@pytest.mark.parametrize("transpose", [False, True])
def test_transferred_u_net_equals_the_old_one_on_resampled_spectra(transpose, prior):
    """Carried from 5 bands to 7 (other wavelengths), the U-Net computes what the old one computes on the new
    bands resampled to the old: U'(x) = x + Q·(U(P x) − P x) with P, Q the interpolations between the grids; with
    ``transpose``, on the transposed window (the dispersion along the other axis)."""
    from cassi.models.refine import spectral_interp, transfer_weights

    old = tiny(mask_input=True, prior=prior)
    nm0, nm1 = [450.0, 480.0, 520.0, 570.0, 640.0], [420.0, 460.0, 500.0, 540.0, 580.0, 620.0, 680.0]
    new = Refiner(bands=7, width=4, depth=2, solver=FAST_TV, mask_input=True, prior=prior)
    new.load_state_dict(transfer_weights(old.state_dict(), (5, 7), (nm0, nm1), transpose))
    p, q = spectral_interp(nm1, nm0).float(), spectral_interp(nm0, nm1).float()
    g = torch.Generator().manual_seed(1)
    x, r = torch.rand(2, 7, 16, 12, generator=g), 0.1 * torch.randn(2, 7, 16, 12, generator=g)
    m = (torch.rand(1, 1, 16, 12, generator=g) > 0.5).float()
    to_old = (lambda t: t.transpose(-1, -2)) if transpose else (lambda t: t)
    s = torch.ones(2, 1, 1, 1)
    with torch.no_grad():
        got = new.refine(x, r, s, mask=m)
        x0 = torch.einsum("sd,bdhw->bshw", p, to_old(x))
        ref = old.refine(x0, torch.einsum("sd,bdhw->bshw", p, to_old(r)), s, mask=to_old(m)) - x0
    want = x + to_old(torch.einsum("ds,bshw->bdhw", q, ref))
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="has 11 inputs, not 2·4"):
        transfer_weights(old.state_dict(), (4, 7))


def test_init_weights_carries_a_refiner_to_another_camera(tmp_path, caplog):
    """init_weights= from a 5-band model dispersing along w into a 7-band one along h: the U-Net's band-wise
    weights are resampled (by band position when wavelengths are unknown) and its kernels transposed; the same
    camera copies the weights as they are."""
    import logging
    from functools import partial

    from cassi.lightning import TrainingModule

    old = tiny(mask_input=True)
    path = checkpoint(tmp_path / "w.ckpt", old, {"offsets": [0, 2, 4, 6, 8], "axis": "w", "bands": 5})
    new = Refiner(bands=7, width=4, depth=2, solver=FAST_TV, mask_input=True)
    with caplog.at_level(logging.INFO, logger="cassi.models.refine"):
        TrainingModule(new, partial(CASSI, bands=7, step=2, axis="h"), init_weights=str(path))
    assert "carried from 5 to 7 bands (by band position: wavelengths not known), dispersion along w to h" in caplog.text
    w_old, w_new = old.priors[0].down[0][0].weight, new.priors[0].down[0][0].weight
    assert w_new.shape[1] == 15 and torch.equal(w_new[:, 14], w_old[:, 10].transpose(-1, -2))  # the mask's input
    assert torch.equal(w_new[:, 0], w_old[:, 0].transpose(-1, -2))  # the first band maps onto the first
    same = Refiner(bands=5, width=4, depth=2, solver=FAST_TV, mask_input=True)
    TrainingModule(same, partial(CASSI, bands=5, step=2), init_weights=str(path))
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), old.state_dict().values()))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["strided", "auto"])
def test_the_pool_computed_on_the_gpu_equals_the_cpu_pool_and_stays_on_the_cpu(backend):
    cpu = pool(solver=FAST_TV, backend=backend, device="cpu").scenes
    on = pool(solver=FAST_TV, backend=backend, device=None)  # None: CUDA when there is one
    assert on.device.type == "cuda"
    gpu = on.scenes
    for k in ("x", "x0", "r", "y", "mask", "scale"):
        assert gpu[k].device.type == "cpu"
        assert torch.allclose(gpu[k].float(), cpu[k].float(), atol=2e-3, rtol=2e-3), k


def test_a_widened_u_net_computes_the_narrow_one_and_its_new_channels_learn():
    """widen_state at depth 3 (skips, transposed convolutions, fuse's concatenation): the same output in float64 to
    rounding; after two SGD steps the new channels' filters have moved; a narrower target is refused."""
    from cassi.models.blocks import UNet, widen_state

    torch.manual_seed(0)
    old = UNet(9, 4, 4, 3).double()
    for p in old.parameters():  # weights far from their initialisation: every old channel matters
        torch.nn.init.normal_(p, std=0.3)
    new = UNet(9, 4, 7, 3).double()
    new.load_state_dict(widen_state(old.state_dict(), new))
    x = torch.rand(2, 9, 20, 24, dtype=torch.float64)
    torch.testing.assert_close(new(x), old(x), rtol=1e-12, atol=1e-10)
    assert new.fuse[0][0].weight[:4, 4:7].abs().max() == 0 and new.fuse[0][0].weight[:4, 7:11].abs().max() > 0
    before = new.down[0][0].weight[4:].clone()
    opt = torch.optim.SGD(new.parameters(), lr=1e-3)
    for _ in range(2):  # the first step moves the zero readers, the second the new filters behind them
        opt.zero_grad()
        (new(x) - x[:, :4]).square().mean().backward()
        opt.step()
    assert not torch.equal(new.down[0][0].weight[4:], before)
    with pytest.raises(ValueError, match=r"widen_state: down.0.0.weight is \(7, 9, 3, 3\), wider than \(4, 9, 3, 3\)"):
        widen_state(UNet(9, 4, 7, 3).state_dict(), UNet(9, 4, 4, 3))
