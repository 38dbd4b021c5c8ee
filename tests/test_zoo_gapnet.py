"""GAP-Net and ADMM-Net as the MST toolbox has them (cassi.models.zoo.gapnet): equal to the toolbox's output
(references made with its code, tests/make_zoo_reference.py, at 32×256: its output crop hard-codes 256 columns),
converted weights, the dispersed-frame math on geometries the toolbox never ran, and a training step."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import zoo_common as zc
from cassi import CASSI
from cassi.models import load_model
from cassi.models.zoo import toolbox
from cassi.models.zoo.gapnet import ToolboxADMMNet, ToolboxGAPNet

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["gap_net", "admm_net"]


@pytest.mark.parametrize("method", METHODS)
def test_equals_the_toolbox(method):
    ref = zc.load_reference(method)
    assert ref["input_setting"] == "Y" and ref["input_mask"] == "Phi_PhiPhiT"
    zc.assert_matches(zc.cassi_output(method, ref), ref)


@pytest.mark.parametrize("method", METHODS)
def test_a_wrong_mapping_fails_the_equality_check(method):
    """Negative control of test_equals_the_toolbox: the seeded weights with two convolutions of one shape exchanged
    in every stage's U-Net (the toolbox's dconv_down1 and dconv_up1 second 3×3 convolutions, both width → width)
    leave its tolerance."""
    ref = zc.load_reference(method)
    model = toolbox.build(method)
    state = toolbox.seeded_state(model, ref["weight_seed"])
    pairs = [(k, k.replace(".enc.0.2.", ".dec.0.2.")) for k in state if ".enc.0.2." in k]
    assert len(pairs) == 2 * 9  # weight and bias, 9 stages
    model.load_state_dict(zc.swapped(state, pairs))
    zc.assert_fails_the_check(zc.cassi_output(method, ref, model), ref)


@pytest.mark.parametrize("method", METHODS)
def test_toolbox_weights_convert(method, tmp_path):
    ref = zc.load_reference(method)
    pth = zc.toolbox_checkpoint(method, ref, tmp_path / "x.pth")
    out = toolbox.convert(method, pth, tmp_path / "x.ckpt")
    model = load_model(out)
    assert type(model) is (ToolboxGAPNet if method == "gap_net" else ToolboxADMMNet)
    assert sum(p.numel() for p in model.parameters()) == (4271580 if method == "gap_net" else 4271589)  # the toolbox's
    zc.assert_matches(zc.cassi_output(method, ref, model), ref)


def test_convert_script_refuses_another_methods_weights(tmp_path):
    ref = zc.load_reference("gap_net")
    pth = zc.toolbox_checkpoint("gap_net", ref, tmp_path / "g.pth")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), "method=admm_net",
                        f"weights={pth}", f"out={tmp_path / 'a.ckpt'}"], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=300)
    assert r.returncode != 0 and "missing ['gammas.0'" in r.stderr


# ------------------------------------------------------------------ the toolbox's math, written out
def dispersed_reference(model, op, y):
    """What the toolbox computes, on its dispersed frame (axis w, integer offsets): Phi the shifted mask,
    A x = Σ_c Phi_c x_c, Aᵀ r = Phi r, every band rolled back by d_c before each U-Net and forward after it,
    the first W columns returned."""
    offs = [int(o) for o in op.offsets]
    phi, phis = toolbox.shifted_mask(op), toolbox.phi_s(op)

    def fwd(x):
        return (x * phi).sum(1, keepdim=True)

    def prior(k, x):
        return toolbox.roll_bands(model.unets[k](toolbox.roll_bands(x, offs, -1)), offs, 1)

    x = y * phi
    if isinstance(model, ToolboxGAPNet):
        for k in range(model.stages):
            x = prior(k, x + phi * ((y - fwd(x)) / phis))
    else:
        theta, b = x, torch.zeros_like(x)
        for k in range(model.stages):
            v = theta + b
            x = v + phi * ((y - fwd(v)) / (phis + model.gammas[k]))
            theta = prior(k, x - b)
            b = b - (x - theta)
        x = theta
    return x[..., :op.mask.shape[-1]]


def small(cls, bands=28, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(bands=bands, stages=2, width=4, **kw).eval()


def test_the_data_step_is_the_fused_operator_step_on_the_rolled_back_frame():
    """x + Aᵀ((y − A x) ⊘ Φ_s) on the dispersed frame = op.data_step on the first W columns of the rolled-back
    frame, the wrapped-around Δ columns unchanged; (Φ_s + γ) = data_step's rho."""
    g = torch.Generator().manual_seed(0)
    op = CASSI((torch.rand(2, 1, 12, 20, generator=g) > 0.4).float(), bands=5, offsets=[0, 3, 1, 6, 4])
    offs = [int(o) for o in op.offsets]
    u = torch.rand(2, 5, 12, 20 + op.delta, generator=g)
    y = torch.rand(2, 1, 12, 20 + op.delta, generator=g)
    phi, phis = toolbox.shifted_mask(op), toolbox.phi_s(op)
    for rho in (0.0, torch.tensor([0.3]), torch.tensor([-0.4])):
        x = toolbox.roll_bands(u, offs, 1)
        x = x + phi * ((y - (x * phi).sum(1, keepdim=True)) / (phis + rho))
        want = toolbox.roll_bands(x, offs, -1)
        got = ToolboxGAPNet._step(op, u, y, rho)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got[..., 20:], u[..., 20:])


@pytest.mark.parametrize("cls", [ToolboxGAPNet, ToolboxADMMNet])
@pytest.mark.parametrize("case", ["31 bands, step 1, 24×40", "offsets in any order", "a mask per sample",
                                  "odd frame 13×27"])
def test_beyond_the_toolbox_equals_its_math(cls, case):
    g = torch.Generator().manual_seed(1)
    if case.startswith("31"):
        bands, mask, kw = 31, torch.rand(24, 40, generator=g) > 0.5, {"step": 1}
    elif case.startswith("offsets"):
        bands, mask, kw = 6, torch.rand(16, 24, generator=g) > 0.5, {"offsets": [5, 0, 9, 2, 2, 7]}
    elif case.startswith("a mask"):
        bands, mask, kw = 4, torch.rand(2, 1, 16, 16, generator=g), {"step": 2}
    else:
        bands, mask, kw = 3, torch.rand(13, 27, generator=g) > 0.5, {"step": 3}
    op = CASSI(mask.float(), bands=bands, **kw)
    model = small(cls, bands)
    if cls is ToolboxADMMNet:
        with torch.no_grad():
            model.gammas[0].fill_(0.2), model.gammas[1].fill_(-0.05)
    x = torch.rand(mask.shape[0] if mask.ndim == 4 else 2, bands, *mask.shape[-2:], generator=g)
    y = op(x)
    with torch.no_grad():
        got, want = model(op, y), dispersed_reference(model, op, y)
    assert got.shape == x.shape and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_admm_net_with_a_negative_gamma_applies_the_toolbox_weights():
    """γ_k ≤ −min Φ: the toolbox divides by Φ + γ_k < 0 at some pixels; the fused step (which weighs those 0)
    is not used then, and gradients flow through the composed step."""
    op = CASSI((torch.rand(16, 16, generator=torch.Generator().manual_seed(2)) > 0.5).float(), bands=4)
    model = small(ToolboxADMMNet, 4)
    with torch.no_grad():
        model.gammas[1].fill_(-1.5)  # Φ is 1 at some pixels: weight 1/(1 − 1.5) = −2 there
    x = torch.rand(1, 4, 16, 16, generator=torch.Generator().manual_seed(3))
    y = op(x)
    got, want = model(op, y), dispersed_reference(model, op, y)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ga = torch.autograd.grad(got.square().sum(), list(model.gammas))
    gb = torch.autograd.grad(want.square().sum(), list(model.gammas))
    torch.testing.assert_close(torch.cat(ga), torch.cat(gb), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", [ToolboxGAPNet, ToolboxADMMNet])
def test_gradients_equal_the_toolbox_math_and_with_checkpointing(cls):
    op = CASSI((torch.rand(16, 24, generator=torch.Generator().manual_seed(4)) > 0.5).float(), bands=5)
    x = torch.rand(2, 5, 16, 24, generator=torch.Generator().manual_seed(5))
    y = op(x)
    grads = []
    for ckpt in (False, True, None):
        model = small(cls, 5, checkpointing=bool(ckpt)).train()
        if cls is ToolboxADMMNet:
            with torch.no_grad():
                model.gammas[0].fill_(0.3)
        out = model(op, y) if ckpt is not None else dispersed_reference(model, op, y)
        (out - x).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads[2], grads[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls", [ToolboxGAPNet, ToolboxADMMNet])
def test_axis_h_is_the_transposed_problem(cls):
    g = torch.Generator().manual_seed(6)
    mask = (torch.rand(20, 16, generator=g) > 0.5).float()
    x = torch.rand(1, 4, 20, 16, generator=g)
    op_h, op_w = CASSI(mask, bands=4, axis="h"), CASSI(mask.T, bands=4)
    model = small(cls, 4)
    with torch.no_grad():
        got = model(op_h, op_h(x))
        want = model(op_w, op_w(x.transpose(-1, -2))).transpose(-1, -2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bf16_autocast_runs():
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=4)
    model = small(ToolboxADMMNet, 4)
    x = torch.rand(1, 4, 16, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(op, op(x))
    assert out.dtype == torch.float32 and out.shape == x.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("cls", [ToolboxGAPNet, ToolboxADMMNet])
def test_refuses_fractional_offsets_small_frames_and_other_band_counts(cls):
    model = small(cls, 4)
    frac = CASSI(torch.ones(16, 16), bands=4, step=1.5)
    with pytest.raises(ValueError, match=r"dispersed frame, which needs integer offsets.*camera.step=2"):
        model(frac, torch.zeros(1, 1, 16, 21))
    tiny = CASSI(torch.ones(4, 16), bands=4)
    with pytest.raises(ValueError, match=r"needs a dispersed frame of at least 8×8 pixels \(.*\), got 4×22"):
        model(tiny, torch.zeros(1, 1, 4, 22))
    with pytest.raises(ValueError, match="reconstructs 4 bands but the operator has 5"):
        model(CASSI(torch.ones(16, 16), bands=5), torch.zeros(1, 1, 16, 24))


def test_docstrings_say_how_they_differ_from_cassis_own():
    from cassi.models import ADMMNet, GAPNet

    assert "model=gapnet" in ToolboxGAPNet.__doc__ and "GAPNet" in ToolboxGAPNet.__doc__
    assert "model=admmnet" in ToolboxADMMNet.__doc__ and "fractional" in ToolboxADMMNet.__doc__
    assert GAPNet is not ToolboxGAPNet and ADMMNet is not ToolboxADMMNet


# ------------------------------------------------------------------ training
def test_the_toolbox_protocol_composes():
    """experiment=toolbox schedule=toolbox_gap_net (model=toolbox_gap_net or toolbox_admm_net): lr 1e-3, ×0.9
    every 30 epochs of 1000 steps, RMSE."""
    for name, target in (("toolbox_gap_net", ToolboxGAPNet), ("toolbox_admm_net", ToolboxADMMNet)):
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=["experiment=toolbox", f"model={name}", "schedule=toolbox_gap_net"])
        assert cfg.model._target_.endswith(target.__name__) and cfg.module.loss.kind == "rmse"
        opt = instantiate(cfg.module.optimizer)([torch.zeros(1, requires_grad=True)])
        sched = instantiate(cfg.module.scheduler)(opt)
        steps = (0, 29999, 30000, 59999, 60000, 90000)
        lrs = {t: 1e-3 * sched.lr_lambdas[0](t) for t in steps}  # LambdaLR: lr_t = lr·factor(t)
        want = {0: 1e-3, 29999: 1e-3, 30000: 9e-4, 59999: 9e-4, 60000: 8.1e-4, 90000: 7.29e-4}
        assert lrs == pytest.approx(want)


def test_a_training_step_through_train_py(tmp_path):
    zc.train_one_step(tmp_path, "model=toolbox_gap_net", "model.stages=2", "model.width=4", "module.loss.kind=rmse")
