"""HDNet as the MST toolbox has it (cassi.models.zoo.hdnet): equal to the toolbox's output (reference made with
its code, tests/make_zoo_reference.py, at 64×64), converted weights, its real-data variant, geometries beyond the
toolbox's, the frequency loss (FDL) it trains with, and a training step with that loss."""
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
from cassi.models.zoo.hdnet import FDL, HDNet, HDNetLoss

ROOT = Path(__file__).resolve().parents[1]


def test_equals_the_toolbox():
    ref = zc.load_reference("hdnet")
    assert ref["input_setting"] == "H" and ref["input_mask"] == "None"
    zc.assert_matches(zc.cassi_output("hdnet", ref), ref)


def test_a_wrong_mapping_fails_the_equality_check():
    """Negative control of test_equals_the_toolbox: the seeded weights with each residual block's two 3×3
    convolutions exchanged (the toolbox's body.<i>.body.0 and body.2 mapped the wrong way round) leave its
    tolerance."""
    ref = zc.load_reference("hdnet")
    model = toolbox.build("hdnet")
    state = toolbox.seeded_state(model, ref["weight_seed"])
    pairs = [(k, k.replace(".conv1.", ".conv2.")) for k in state if ".conv1." in k]
    assert len(pairs) == 2 * (16 + 15)  # weight and bias of every residual block
    model.load_state_dict(zc.swapped(state, pairs))
    zc.assert_fails_the_check(zc.cassi_output("hdnet", ref, model), ref)


def test_toolbox_weights_convert(tmp_path):
    ref = zc.load_reference("hdnet")
    pth = zc.toolbox_checkpoint("hdnet", ref, tmp_path / "x.pth")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), "source=mst", "method=hdnet",
                        f"weights={pth}", f"out={tmp_path / 'x.ckpt'}"], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    model = load_model(tmp_path / "x.ckpt")
    assert type(model) is HDNet and sum(p.numel() for p in model.parameters()) == 2367400  # the toolbox's
    zc.assert_matches(zc.cassi_output("hdnet", ref, model), ref)


def small(bands=4, seed=0, **kw):
    torch.manual_seed(seed)
    return HDNet(bands=bands, feats=8, blocks=(1, 1), **kw).eval()


def test_the_real_data_variant_equals_the_toolbox(tmp_path):
    """hdnet_real against the toolbox's real/train_code HDNet (reference made by hand, at 64×64, with its code
    on y·2/28·1.2, the scale its real data feed it), also after conversion."""
    ref = zc.load_reference("hdnet_real")
    c, h, w = ref["shape"]
    op = CASSI(zc.mask((h, w), ref["mask_seed"]), bands=c, step=2)
    y = op(zc.scene((c, h, w), ref["scene_seed"])) * ref["y_scale"]
    model = toolbox.build("hdnet_real")
    model.load_state_dict(toolbox.seeded_state(model, ref["weight_seed"]))
    with torch.no_grad():
        zc.assert_matches(model.eval()(op, y), ref)
    loaded = load_model(toolbox.convert("hdnet_real", zc.toolbox_checkpoint("hdnet_real", ref, tmp_path / "r.pth"),
                                        tmp_path / "r.ckpt"))
    with torch.no_grad():
        zc.assert_matches(loaded.eval()(op, y), ref)


def test_the_real_data_variant_fuses_the_unscaled_input_first():
    """hdnet_real: a 3×3 conv (no bias) on y shifted back without 2/C; with that conv the identity times 2/C
    it is the simulation model."""
    assert sum(p.numel() for p in toolbox.build("hdnet_real").parameters()) == 2367400 + 28 * 28 * 9
    sim = small()
    real = small(real=True)
    real.load_state_dict({**sim.state_dict(), "fuse_input.weight": torch.zeros(4, 4, 3, 3)}, strict=True)
    with torch.no_grad():
        real.fuse_input.weight[:, :, 1, 1] = torch.eye(4) * (2 / 4)
    op = CASSI((torch.rand(12, 16) > 0.5).float(), bands=4)
    y = op(torch.rand(1, 4, 12, 16))
    with torch.no_grad():
        torch.testing.assert_close(real(op, y), sim(op, y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["31 bands 20×36", "fractional step 1.5", "axis h", "a mask per sample"])
def test_geometries_beyond_the_toolbox(case):
    g = torch.Generator().manual_seed(1)
    bands, shape, kw = 4, (16, 24), {}
    if case.startswith("31"):
        bands, shape = 31, (20, 36)
    elif case.startswith("fractional"):
        kw = {"step": 1.5}
    elif case == "axis h":
        kw = {"axis": "h"}
    mask = torch.rand(2, 1, *shape, generator=g) if case.startswith("a mask") else torch.rand(*shape, generator=g) > 0.5
    op = CASSI(mask.float(), bands=bands, **kw)
    x = torch.rand(2, bands, *shape, generator=g)
    model = small(bands)
    y = op(x)
    with torch.no_grad():
        out = model(op, y)
        assert out.shape == x.shape and torch.isfinite(out).all()
        # H is the operator's shift-back: the network sees y·2/C placed back under each band, in any geometry
        torch.testing.assert_close(out, model.net(toolbox.shift_back(op, y)), rtol=0, atol=0)
        one = model(op if mask.ndim == 2 else CASSI(mask[1:].float(), bands=bands, **kw), y[1:])
    torch.testing.assert_close(one, out[1:], rtol=1e-5, atol=1e-6)  # a batch is its samples (eval mode)


def test_checkpointing_gives_the_same_gradients_and_bf16_runs():
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=4)
    x = torch.rand(2, 4, 16, 16)
    grads = []
    for ckpt in (False, True):
        model = small(checkpointing=ckpt).train()
        (model(op, op(x)) - x).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = small().eval()(op, op(x))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_refuses_other_band_counts_and_runs_on_any_frame():
    model = small()
    with torch.no_grad():
        assert model(CASSI(torch.ones(1, 2), bands=4), torch.zeros(1, 1, 1, 8)).shape == (1, 4, 1, 2)
    with pytest.raises(ValueError, match="reconstructs 4 bands but the operator has 5"):
        model(CASSI(torch.ones(16, 16), bands=5), torch.zeros(1, 1, 16, 24))
    with pytest.raises(ValueError, match="feats must be a multiple of 8"):
        HDNet(feats=12)


# ------------------------------------------------------------------ the frequency loss
def test_fdl_equals_the_toolbox_value():
    """The toolbox's FDL (torch.rfft(·, 2, onesided=False, normalized=True) run as fft2(norm="ortho")) gave
    0.00862596557 on these inputs with HDNet's settings."""
    g = torch.Generator().manual_seed(0)
    pred, target = torch.rand(3, 28, 32, 48, generator=g), torch.rand(3, 28, 32, 48, generator=g)
    fdl = FDL(loss_weight=0.7, alpha=2.0, patch_factor=4, ave_spectrum=True, log_matrix=True, batch_matrix=True)
    assert fdl(pred, target).item() == pytest.approx(0.00862596557, rel=1e-5)


def test_fdl_is_the_weighted_spectral_distance_per_patch():
    g = torch.Generator().manual_seed(1)
    pred, target = torch.rand(2, 3, 8, 12, generator=g, requires_grad=True), torch.rand(2, 3, 8, 12, generator=g)
    fdl = FDL(alpha=1.0, patch_factor=2)  # per-patch scaling, no log, no batch average
    d = torch.stack([torch.fft.fft2(pred[..., i:i + 4, j:j + 6] - target[..., i:i + 4, j:j + 6], norm="ortho")
                     for i in (0, 4) for j in (0, 6)], 1)
    w = d.abs() / d.abs().amax(dim=(-2, -1), keepdim=True)
    loss = fdl(pred, target)
    torch.testing.assert_close(loss, (w.detach() * d.abs().square()).mean())
    loss.backward()
    assert torch.isfinite(pred.grad).all()
    assert fdl(target, target).item() == 0.0  # no NaN from 0/0 weights
    with pytest.raises(ValueError, match="patch_factor 2 must divide the frame 9×12"):
        fdl(torch.zeros(1, 1, 9, 12), torch.zeros(1, 1, 9, 12))


def test_hdnet_loss_is_rmse_plus_the_weighted_fdl():
    g = torch.Generator().manual_seed(2)
    pred, target = torch.rand(2, 4, 16, 16, generator=g), torch.rand(2, 4, 16, 16, generator=g)
    fdl = FDL(loss_weight=0.7, alpha=2.0, patch_factor=4, ave_spectrum=True, log_matrix=True, batch_matrix=True)
    want = (pred - target).square().mean().sqrt() + 0.7 * fdl(pred, target)
    torch.testing.assert_close(HDNetLoss()(pred, target), want)


def test_the_toolbox_protocol_composes():
    """experiment=toolbox model=hdnet schedule=toolbox_hdnet: lr 4e-4 halved at epochs 50, 100, …, 250 (1000 steps
    each), RMSE + 0.7·FDL."""
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=toolbox", "model=hdnet", "schedule=toolbox_hdnet"])
    assert cfg.model._target_ == "cassi.models.zoo.hdnet.HDNet"
    loss = instantiate(cfg.module.loss)
    assert isinstance(loss, HDNetLoss) and loss.fdl_scale == 0.7 and loss.fdl.loss_weight == 0.7
    opt = instantiate(cfg.module.optimizer)([torch.zeros(1, requires_grad=True)])
    sched = instantiate(cfg.module.scheduler)(opt)
    lrs = [4e-4 * sched.lr_lambdas[0](t) for t in (0, 49999, 50000, 100000, 250000, 299999)]
    assert lrs == pytest.approx([4e-4, 4e-4, 2e-4, 1e-4, 1.25e-5, 1.25e-5])


def test_a_training_step_with_the_frequency_loss_through_train_py(tmp_path):
    zc.train_one_step(tmp_path, "model=hdnet", "model.feats=8", "model.blocks=[1,1]",
                      "module.loss._target_=cassi.models.zoo.hdnet.HDNetLoss", "module.loss.kind=rmse",
                      "+module.loss.fdl=0.7")
