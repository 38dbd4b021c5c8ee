"""Unrolled networks (cassi.models): any geometry, gradients, first iterate, configs, checkpoints."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from cassi import CASSI
from cassi.metrics import ssim
from cassi.models import ADMMNet, DAUHST, GAPNet, ReconstructionLoss, load_model, load_prior

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = {"GAPNet": dict(width=4, depth=2), "ADMMNet": dict(width=4, depth=2)}


def tiny(name: str, bands: int, stages: int = 2, seed: int = 0, **kw):
    """A tiny model with seeded weights (at width 4 an unlucky draw can leave every ReLU of a block dead)."""
    torch.manual_seed(seed)
    return {"GAPNet": GAPNet, "ADMMNet": ADMMNet}[name](bands=bands, stages=stages, **TINY[name], **kw)


def tiny_dauhst(bands: int, stages: int = 2, seed: int = 0) -> DAUHST:
    """A tiny DAUHST (the toolbox's architecture, cassi.models.zoo.dauhst; its own tests: tests/test_zoo_dauhst.py)."""
    torch.manual_seed(seed)
    return DAUHST(bands=bands, stages=stages, dim=4, blocks=[1, 1], window=4, frame=[16, 32])


def random_op(batch, bands, h, w, seed=0, **geometry):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(batch, 1, h, w, generator=g) > 0.4).float()
    return CASSI(mask, bands=bands, backend="strided", **geometry), torch.rand(batch, bands, h, w, generator=g)


GEOMETRIES = [dict(step=2), dict(step=1, axis="h"), dict(offsets=[0.0, 1.5, 2.25, 4.0, 5.5])]


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["step2", "step1-h", "fractional"])
def test_forward_backward_any_geometry_with_a_batch_of_masks(name, geometry):
    """Odd sizes (not multiples of the networks' strides), 5 bands, a different mask per sample."""
    op, x = random_op(3, 5, 13, 11, **geometry)
    model = tiny(name, 5, stages=3)
    outs = model(op, op(x), return_stages=True)
    assert len(outs) == 4 and all(o.shape == x.shape for o in outs)
    assert torch.equal(outs[0], op.pinv(op(x)))  # the first iterate is the masked pseudo-inverse
    outs[-1].square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_stage_changes_the_output(name):
    """Each stage's prior is used: perturbing the weights of stage k changes the output."""
    op, x = random_op(2, 4, 16, 16)
    model = tiny(name, 4, stages=3).eval()
    y = op(x)
    with torch.no_grad():
        base = model(op, y)
        for k in range(3):
            before = [p.clone() for p in model.prior(k).parameters()]
            for p in model.prior(k).parameters():
                p.add_(0.05)
            assert not torch.allclose(model(op, y), base), f"stage {k} has no effect"
            for p, b in zip(model.prior(k).parameters(), before):
                p.copy_(b)


def test_model_is_a_solver_and_sizes_are_independent_of_the_stride():
    """The same weights reconstruct any size; the model is called like a solver (op, y, gt=...)."""
    model = tiny("GAPNet", 6)
    for h, w in ((7, 9), (16, 16), (33, 20)):
        op, x = random_op(1, 6, h, w, step=3)
        assert model(op, op(x), gt=x).shape == (1, 6, h, w)


def test_shared_stage_weights():
    shared, separate = GAPNet(4, stages=4, width=4, depth=2, share=True), GAPNet(4, stages=4, width=4, depth=2)
    assert len(shared.priors) == 1 and len(separate.priors) == 4
    n = lambda m: sum(p.numel() for p in m.priors.parameters())  # noqa: E731
    assert n(separate) == 4 * n(shared)


@pytest.mark.parametrize("name", sorted(TINY))
def test_activation_checkpointing_gives_the_same_values_and_gradients(name):
    op, x = random_op(2, 4, 12, 12)
    y = op(x)
    a, b = tiny(name, 4), tiny(name, 4, checkpointing=True)
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        m(op, y).square().sum().backward()
    assert torch.allclose(a(op, y), b(op, y), atol=1e-6)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, rtol=1e-4, atol=1e-7), n


def test_bf16_autocast_keeps_the_operator_in_float32():
    op, x = random_op(2, 4, 16, 16)
    model = tiny_dauhst(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(op, op(x))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.mean().backward()


def test_wrong_band_count_is_refused():
    op, x = random_op(1, 5, 8, 8)
    with pytest.raises(ValueError, match="reconstructs 4 bands but the operator has 5"):
        tiny("GAPNet", 4)(op, op(x))


def test_the_check_runs_when_the_model_first_meets_an_operator(monkeypatch):
    """Every reconstructor is checked in one place, Reconstructor.__call__: once per operator it meets, again on
    another, and again after a refusal; the camera warning only in eval mode (training masks are the camera)."""
    from cassi.models import camera as camera_module

    model, calls = tiny("GAPNet", 5).eval(), []
    model.camera = {"masks": {"kind": "bernoulli", "p": 0.9}, "noise": None}
    monkeypatch.setattr(camera_module, "check_geometry", lambda m, op: calls.append(("geometry", op)))
    monkeypatch.setattr("cassi.models.unrolled.check_geometry", lambda m, op: calls.append(("geometry", op)))
    monkeypatch.setattr("cassi.models.unrolled.check_camera", lambda m, op: calls.append(("camera", op)))
    op, x = random_op(1, 5, 8, 8)
    for _ in range(3):
        model(op, op(x))
    assert calls == [("geometry", op), ("camera", op)]
    other, _ = random_op(1, 5, 8, 8, seed=1)
    model.train()(other, other(x))
    assert calls[2:] == [("geometry", other)]  # training: no camera warning
    import pickle
    copy = pickle.loads(pickle.dumps(model))  # a model that has met an operator still pickles; its copy checks anew
    copy(other, other(x))
    assert calls[3:] == [("geometry", other)]
    bad, _ = random_op(1, 6, 8, 8)
    monkeypatch.undo()
    for _ in range(2):  # a refused operator is refused every time, not remembered as met
        with pytest.raises(ValueError, match="reconstructs 5 bands but the operator has 6"):
            model(bad, bad(torch.rand(1, 6, 8, 8)))


@pytest.mark.parametrize("bad", [dict(stages=0), dict(bands=0), dict(stages=1.5)])
def test_invalid_sizes(bad):
    with pytest.raises(ValueError, match="positive integer"):
        GAPNet(**{"bands": 4, "stages": 2, **bad})


def test_losses():
    p, t = torch.full((1, 2, 8, 8), 0.5), torch.zeros(1, 2, 8, 8)
    assert ReconstructionLoss("l1")(p, t) == pytest.approx(0.5)
    assert ReconstructionLoss("mse")(p, t) == pytest.approx(0.25)
    assert ReconstructionLoss("rmse")(p, t) == pytest.approx(0.5)
    assert ReconstructionLoss("charbonnier", eps=1e-3)(p, t) == pytest.approx((0.25 + 1e-6) ** 0.5)
    x = torch.rand(1, 3, 16, 16)
    assert ReconstructionLoss("l1", ssim=1.0)(x, x) == pytest.approx(0.0, abs=1e-5)
    assert ReconstructionLoss("l1", ssim=1.0)(x, 1 - x) > ReconstructionLoss("l1")(x, 1 - x)
    with pytest.raises(ValueError, match="loss kind"):
        ReconstructionLoss("l3")


def test_gradient_term_weighs_the_errors_edges():
    """gradient: w·(mean|∂_h d| + mean|∂_w d|) of the error d = x̂ − x (on ℓ's scale): a constant offset has none,
    a vertical and a horizontal seam each add their step."""
    t = torch.rand(1, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    offset = t + 0.25
    assert ReconstructionLoss("l1", gradient=2.0)(offset, t) == pytest.approx(0.25)
    seam = t.clone()
    seam[..., 4:] += 0.5                                # an error that steps once along w, in every row
    step_w = 0.5 * 8 / (8 * 7)                          # one step of 0.5 in each row's 7 differences
    assert ReconstructionLoss("l1", gradient=2.0)(seam, t) == pytest.approx(0.25 + 2.0 * step_w)
    assert ReconstructionLoss("l1", gradient=2.0)(seam.transpose(-1, -2), t.transpose(-1, -2)) == pytest.approx(
        0.25 + 2.0 * step_w)                            # along h alike
    scale = 2 * t.mean()
    assert ReconstructionLoss("l1", gradient=1.0, relative=True)(seam, t) == pytest.approx(
        ReconstructionLoss("l1", gradient=1.0)(seam / scale, t / scale).item(), rel=1e-5)
    with pytest.raises(ValueError, match="gradient weights must be >= 0"):
        ReconstructionLoss("l1", gradient=-1.0)


@pytest.mark.parametrize("kind", ["l1", "mse", "rmse", "charbonnier"])
def test_relative_loss_scales_the_error_but_takes_ssim_as_the_metric_does(kind):
    # a dark pair: SSIM at data range 1 is lenient there; divided by 2·mean(x) it would not be
    g = torch.Generator().manual_seed(0)
    t = 0.05 * torch.rand(2, 3, 24, 24, generator=g)
    p = t + 0.02 * torch.randn(2, 3, 24, 24, generator=g)
    scale = 2 * t.mean(dim=(1, 2, 3), keepdim=True)
    pixel = ReconstructionLoss(kind, eps=1e-3)(p / scale, t / scale)   # the pixel term on normalised cubes
    assert ReconstructionLoss(kind, relative=True, eps=1e-3)(p, t) == pytest.approx(pixel.item(), rel=1e-5)
    assert pixel > 2 * ReconstructionLoss(kind, eps=1e-3)(p, t)        # and the normalisation matters here
    metric = 1 - ssim(p, t).mean()
    assert metric < 1 - ssim(p / scale, t / scale).mean() - 0.1   # the two scales really differ here
    both = ReconstructionLoss(kind, ssim=1.0, relative=True, eps=1e-3)(p, t)
    assert both == pytest.approx((pixel + metric).item(), rel=1e-5)


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONF / "model").glob("*.yaml") if p.stem != "from_checkpoint"))
def test_every_model_config_instantiates_and_runs(model):  # from_checkpoint: a checkpoint's (tests/test_train.py)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={model}", "bands=4"])
    small = {"stages": 2, "width": 4, "depth": 2, "dim": 4, "window": 4, "feats": 8, "blocks": [1, 1],
             "num_blocks": [1, 1, 1]}
    for k, v in small.items():
        if k in cfg.model and not (k == "dim" and cfg.model[k] is None):
            cfg.model[k] = v
    net = instantiate(cfg.model)
    assert type(net).__name__ == cfg.model._target_.rsplit(".", 1)[1] and net.config["bands"] == 4
    op, x = random_op(1, 4, 16, 16)
    assert net(op, op(x)).shape == x.shape


def test_published_sizes_of_the_model_configs():
    """GAP-Net/ADMM-Net at 9 stages, widths 32-64-128: the published 4.27 M parameters."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for name in ("gapnet", "admmnet"):
            net = instantiate(compose("train", overrides=[f"model={name}"]).model)
            assert sum(p.numel() for p in net.parameters()) == pytest.approx(4.27e6, rel=0.01)


# --------------------------------------------------------------------------- checkpoints
def fake_checkpoint(path, model, geometry=None):
    """A checkpoint as TrainingModule writes it (state under 'reconstructor.', a 'cassi' entry)."""
    torch.save({"state_dict": {f"reconstructor.{k}": v for k, v in model.state_dict().items()},
                "cassi": {"model": model.config, "geometry": geometry, "wavelengths": None}}, path)
    return path


def test_export_weights_with_a_setting_chosen_by_the_card(tmp_path):
    """config={"project": True}: the shipped Refiner projects its stages onto y, the same weights otherwise."""
    from cassi.models import Refiner, export_weights

    op, x = random_op(1, 5, 16, 16)
    torch.manual_seed(0)
    model = Refiner(bands=5, width=4, depth=2, solver={"_target_": "cassi.solvers.GAPTV", "iters": 3}).eval()
    path = fake_checkpoint(tmp_path / "full.ckpt", model, {"offsets": op.offsets, "axis": "w", "bands": 5})
    loaded = load_model(export_weights(path, tmp_path / "w.ckpt", config={"project": True}))
    assert loaded.project and loaded.config["project"] and not model.project
    with torch.no_grad():
        out, plain = loaded(op, y := op(x)), model(op, y)
        model.project = True
        assert torch.equal(out, model(op, y)) and not torch.allclose(out, plain)
    assert torch.allclose(op(out), y, atol=1e-4)  # consistent with the measurement


def test_load_model_from_path_alone(tmp_path):
    op, x = random_op(2, 5, 12, 12)
    model = tiny_dauhst(5).eval()
    path = fake_checkpoint(tmp_path / "m.ckpt", model, {"offsets": op.offsets, "axis": "w", "bands": 5})
    loaded = load_model(path)
    assert type(loaded) is DAUHST and not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded(op, op(x)), model(op, op(x)))


def test_load_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.ckpt does not exist"):
        load_model(tmp_path / "nope.ckpt")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.ckpt is not a cassi checkpoint"):
        load_model(tmp_path / "junk.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="other.ckpt is not a cassi checkpoint"):
        load_model(tmp_path / "other.ckpt")
    with pytest.raises(FileNotFoundError, match="no pretrained model 'nothing'"):
        load_model("pretrained/nothing")


def test_loaded_model_refuses_another_geometry(tmp_path):
    model = tiny("GAPNet", 5)
    path = fake_checkpoint(tmp_path / "m.ckpt", model, {"offsets": [0.0, 2, 4, 6, 8], "axis": "w", "bands": 5})
    op1, x = random_op(1, 5, 8, 8, step=1)
    with pytest.raises(ValueError, match=r"m.ckpt was trained for dispersion offsets \[0, 2, …, 8\]"):
        load_model(path)(op1, op1(x))
    with pytest.raises(ValueError, match="along 'w', but the operator .* along 'h'"):
        load_model(path, operator=lambda mask: CASSI(mask, bands=5, step=2, axis="h"))
    op2, _ = random_op(1, 5, 8, 8, step=2)
    load_model(path, operator=lambda mask: CASSI(mask, bands=5, step=2))(op2, op2(x))  # the right one works


def test_trained_prior_as_a_pnp_denoiser(tmp_path):
    from cassi.solvers import GAP

    op, x = random_op(1, 4, 16, 16)
    for name, model in (("GAPNet", tiny("GAPNet", 4)), ("DAUHST", tiny_dauhst(4))):
        path = fake_checkpoint(tmp_path / f"{name}.ckpt", model)
        denoiser = load_prior(path)
        assert denoiser(x).shape == x.shape and denoiser(x, 0.1).shape == x.shape
        result = GAP(denoiser, iters=3)(op, op(x))
        assert result.x.shape == x.shape and result.iterations == 3


@pytest.mark.parametrize("name", sorted(TINY))
def test_normalize_makes_the_model_brightness_equivariant(name):
    """normalize=True: model(op, a·y) = a·model(op, y) for every stage output; without it a random
    network is not (the check can fail)."""
    op, x = random_op(2, 5, 12, 12)
    y = op(x)
    for normalize in (True, False):
        model = tiny(name, 5, stages=2, normalize=normalize).eval()
        for p in model.parameters():  # leave the near-identity start: make the priors clearly non-linear
            p.data.add_(0.2 * torch.randn_like(p))
        with torch.no_grad():
            a = [o * 7.0 for o in model(op, y, return_stages=True)]
            b = model(op, 7.0 * y, return_stages=True)
        same = all(torch.allclose(u, v, rtol=1e-4, atol=1e-5) for u, v in zip(a, b))
        assert same is normalize, f"normalize={normalize}"
    assert model.config["normalize"] is False and tiny(name, 5, normalize=True).config["normalize"] is True
    with torch.no_grad():  # an all-dark measurement stays finite
        assert torch.isfinite(tiny(name, 5, normalize=True)(op, torch.zeros_like(y))).all()


def test_resstack_prior():
    """GAPNet(prior='resstack'): any size (odd sizes pad inside), starts near the identity, trains."""
    from cassi.models import ResStack

    block = ResStack(5, 4, width=8, depth=2)
    x = torch.rand(2, 5, 13, 11)
    out = block(x)
    assert out.shape == (2, 4, 13, 11) and (out - x[:, :4]).abs().max() < 0.05
    torch.manual_seed(0)
    model = GAPNet(bands=5, stages=2, width=8, depth=1, prior="resstack")
    assert model.config["prior"] == "resstack"
    op, x = random_op(2, 5, 13, 11)
    model(op, op(x)).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="prior must be one of"):
        GAPNet(bands=5, stages=2, prior="vit")


def test_relative_loss_weighs_dark_and_bright_samples_alike():
    x = torch.rand(2, 3, 8, 8)
    x[1] *= 0.01  # a dark sample
    pred = x * 1.1  # the same 10 % error in both
    plain, rel = ReconstructionLoss("l1"), ReconstructionLoss("l1", relative=True)
    # plain l1: the dark sample contributes ~1 % of the bright one's error; relative: the same
    assert plain(pred[1:], x[1:]) < 0.02 * plain(pred[:1], x[:1])
    assert torch.allclose(rel(pred[1:], x[1:]), rel(pred[:1], x[:1]), rtol=1e-4)
    assert torch.allclose(rel(pred, x), rel(pred[:1], x[:1]), rtol=1e-4)
    assert "relative=True" in repr(rel)


def test_export_weights_is_small_and_loads_like_the_checkpoint(tmp_path):
    from cassi.models import export_weights

    op, x = random_op(1, 5, 12, 12)
    model = tiny("GAPNet", 5).eval()
    path = fake_checkpoint(tmp_path / "full.ckpt", model, {"offsets": op.offsets, "axis": "w", "bands": 5})
    ckpt = torch.load(path, weights_only=True)
    ckpt["global_step"] = 123
    ckpt["optimizer_states"] = [{"state": {0: torch.zeros(10000)}}]
    ckpt["callbacks"] = {"ElapsedTime": {"cpu_min": 90.0, "wall_min": 48.0}}
    torch.save(ckpt, path)
    for half in (False, True):
        out = export_weights(path, tmp_path / f"w{int(half)}.ckpt", half=half)
        saved = torch.load(out, weights_only=True)
        assert saved["cassi"]["step"] == 123 and "optimizer_states" not in saved
        assert saved["cassi"]["elapsed"] == {"cpu_min": 90.0, "wall_min": 48.0}
        dtypes = {v.dtype for v in saved["state_dict"].values()}
        assert dtypes == ({torch.float16} if half else {torch.float32})
        loaded = load_model(out)
        with torch.no_grad():
            a, b = loaded(op, op(x)), model(op, op(x))
        assert torch.allclose(a, b, atol=0 if not half else 1e-2) and (half or torch.equal(a, b))
    assert not list(tmp_path.glob(".*.tmp"))
    # a card made from the weights-only file (re-carding a shipped model) keeps the training's steps and time
    from cassi.models.card import card_markdown
    rows = [{"name": "s", "psnr": 20.0, "ssim": 0.5, "sam": 9.0, "time": 0.1}]
    results = {split: {"m": rows} for split in ("validation", "test")}
    piece = "123 optimizer steps, 1.50 CPU-hours (0.80 h wall)"  # a checkpoint without a record of earlier pieces
    for ckpt_of_card in (ckpt, saved):
        rows = [r for r in card_markdown("m", loaded, ckpt_of_card, results).splitlines() if r.startswith("| training |")]
        assert len(rows) == 1 and piece in rows[0] and "is not recorded" in rows[0]
    del saved["cassi"]["elapsed"]
    assert "123 optimizer steps, CPU time not recorded" in card_markdown("m", loaded, saved, results)


@pytest.mark.parametrize("name, small", [("dauhst_2stg", ["model.dim=4", "model.window=4"]),
                                         ("refiner", ["model.width=4", "model.depth=2"])])
def test_config_built_by_hydra_is_plain_data(name, small, tmp_path):
    """A model instantiated from its Hydra config (lists arrive as ListConfig, a nested solver config is not
    instantiated) stores plain data, so the checkpoint TrainingModule writes loads with
    torch.load(weights_only=True)."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", *small, "bands=4"])
    model = instantiate(cfg.model)
    def plain(v):
        return v is None or isinstance(v, (str, bool, int, float)) or (
            isinstance(v, list) and all(map(plain, v))) or (isinstance(v, dict) and all(map(plain, v.values())))
    assert plain(model.config), model.config
    path = fake_checkpoint(tmp_path / "d.ckpt", model)
    assert type(load_model(path)).__name__ == type(model).__name__
