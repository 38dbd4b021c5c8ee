"""DAUHST as the MST toolbox has it (cassi.models.zoo.dauhst): equal to the toolbox's output for dauhst_2stg … _9stg
(references made with its code at 256², the only frame its fixed position tables fit: tests/make_zoo_reference.py),
with position tables that matter (tests/data/zoo/dauhst_2stg_tables.pt), its real-data variant (384², and 256²
with the real-data test code's resized tables), converted weights, the data step in cassi's frame, geometries
beyond the toolbox's, and a training step through scripts/train.py.

The extra references are made by this file: ``PYTHONPATH=<einops> .venv/bin/python tests/test_zoo_dauhst.py
{sim,real,realtest} <toolbox code dir>`` (simulation/train_code, real/train_code, real/test_code).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models import load_model  # noqa: E402
from cassi.models.zoo import toolbox  # noqa: E402
from cassi.models.zoo.dauhst import DAUHST, DAUHSTReal, HalfShuffleTransformer, StageEstimator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["dauhst_2stg", "dauhst_3stg", "dauhst_5stg", "dauhst_9stg"]
# the toolbox's parameter counts (its DAUHST(num_iterations=K) on the CPU), simulation and real-data code
PARAMS = {"dauhst_2stg": 1403664, "dauhst_3stg": 2081146, "dauhst_5stg": 3436110, "dauhst_9stg": 6146038,
          "dauhst_2stg_real": 2377224, "dauhst_3stg_real": 3541878, "dauhst_5stg_real": 5871186,
          "dauhst_9stg_real": 10529802}
TABLES = ("attn.bias", "attn.local_bias", "attn.shuffle_bias")


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread per test process: under pytest-xdist every worker would otherwise start one thread per
    core, and on oversubscribed cores every parallel region waits for its threads to get one (several times
    slower); at one thread the blocks also run in their cache-sized strips, which the tests cover."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def with_tables(method: str, seed: int = 0, tables_seed: int = 7, gain: float = 20.0):
    """The seeded weights of ``method`` with its position tables drawn N(0, 1) (the toolbox initialises them at that
    scale) and the attention's output projections and the mappings ×``gain``: with the seeded weights alone the
    tables are too small, and the transformers' part of the output too, to show in the output."""
    model = toolbox.build(method)
    state = toolbox.seeded_state(model, seed)
    g = torch.Generator().manual_seed(tables_seed)
    for k in state:
        if k.endswith(TABLES):
            state[k] = torch.randn(state[k].shape, generator=g)
        elif k.endswith(("attn.proj.weight", "mapping.weight")):
            state[k] = state[k] * gain
    model.load_state_dict(state)
    return model


def reference(name: str):
    ref = zc.load_reference(name)
    if "tables_seed" not in ref:
        return ref, None
    return ref, with_tables(ref["method"], ref["weight_seed"], ref["tables_seed"], ref["gain"])


# ------------------------------------------------------------------ equality with the toolbox
@pytest.mark.parametrize("method", METHODS)
def test_equals_the_toolbox(method):
    ref = zc.load_reference(method)
    assert ref["input_setting"] == "Y" and ref["input_mask"] == "Phi_PhiPhiT" and ref["shape"] == [28, 256, 256]
    model = toolbox.build(method)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[method]
    model.load_state_dict(toolbox.seeded_state(model, ref["weight_seed"]))
    zc.assert_matches(zc.cassi_output(method, ref, model), ref)


@pytest.mark.parametrize("name", ["dauhst_2stg_tables", "dauhst_2stg_real", "dauhst_2stg_real_256"])
def test_equals_the_toolbox_with_position_tables_that_matter(name):
    """Simulation 256²; real-data code at 384² (its tables' frame) and its test code at 256² (tables resized as
    an image: resize="flat")."""
    ref, model = reference(name)
    out = zc.cassi_output(ref["method"], ref, model)
    zc.assert_matches(out, ref)
    with torch.no_grad():  # the tables do matter here: transposed, the output leaves the tolerance
        for k, v in model.state_dict().items():
            if k.endswith("shuffle_bias"):
                v.copy_(v.transpose(-1, -2).clone())
    with pytest.raises(AssertionError, match="max error"):
        zc.assert_matches(zc.cassi_output(ref["method"], ref, model), ref)


@pytest.mark.parametrize("method", ["dauhst_2stg", "dauhst_2stg_real"])
def test_toolbox_weights_convert(method, tmp_path):
    ref, model = reference("dauhst_2stg_tables" if method == "dauhst_2stg" else method)
    pth = tmp_path / "x.pth"
    rename = toolbox.METHODS[method].rename
    state = model.state_dict()
    torch.save({"module." + k: state[rename(k)] for k in ref["toolbox_keys"]}, pth)
    if method == "dauhst_2stg":  # as a user runs it
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), "source=mst",
                            f"method={method}", f"weights={pth}", f"out={tmp_path / 'x.ckpt'}"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stderr[-2000:]
    else:
        toolbox.convert(method, pth, tmp_path / "x.ckpt")
    loaded = load_model(tmp_path / "x.ckpt")
    assert type(loaded) is type(model) and sum(p.numel() for p in loaded.parameters()) == PARAMS[method]
    zc.assert_matches(zc.cassi_output(method, ref, loaded), ref)


def test_parameter_counts_of_every_method():
    for method, n in PARAMS.items():
        assert sum(p.numel() for p in toolbox.build(method).parameters()) == n, method


# ------------------------------------------------------------------ pieces
def test_the_data_step_in_the_rolled_back_frame_is_the_toolbox_step():
    """The toolbox's x + At((y − A(x, Phi)) ⊘ (α + Φ_s), Phi) in the dispersed frame, rolled back per band, is
    cassi's data step on the first W columns and leaves the Δ wrap-around columns as they were."""
    g = torch.Generator().manual_seed(0)
    bands, h, w, step = 5, 12, 16, 3
    masks = (torch.rand(2, bands, h, w, generator=g) > 0.4).float()  # a mask per sample and band
    op = CASSI(masks, step=step)
    offs = toolbox.integer_offsets(op)
    phi = toolbox.shifted_mask(op)  # (2, C, H, W+Δ)
    phi_s = toolbox.phi_s(op)
    z = torch.rand(2, bands, h, w + op.delta, generator=g)  # dispersed frame
    y, alpha = torch.rand(2, 1, h, w + op.delta, generator=g), torch.rand(2, 1, 1, 1, generator=g) + 0.1
    x = z + (y - (z * phi).sum(1, keepdim=True)) / (alpha + phi_s) * phi
    want = toolbox.roll_bands(x, offs, -1)
    zr = toolbox.roll_bands(z, offs, -1)
    got = torch.cat([op.data_step(zr[..., :w].contiguous(), y, alpha), zr[..., w:]], dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [(9, 9), (10, 13), (16, 31), (1, 2)])
def test_the_estimator_pools_the_strided_conv_without_computing_it(size):
    g = torch.Generator().manual_seed(0)
    est = StageEstimator(6, 3, width=8)
    z = torch.randn(2, 6, *size, generator=g)
    alpha, beta = est(z)
    plain = est.mlp(est.down(F.relu(est.inp(z))).mean(dim=(-2, -1), keepdim=True)).flatten(1) + 1e-6
    torch.testing.assert_close(torch.cat([alpha, beta], 1), plain, rtol=1e-5, atol=1e-7)
    assert alpha.shape == beta.shape == (2, 3) and (alpha > 0).all()


def test_strips_and_whole_frames_agree_and_tables_resize(monkeypatch):
    """Without gradients the blocks run in strips of rows, in place; with gradients on whole frames, or in strips
    recomputed in backward (large frames on the CPU): same values and gradients. At the tables' own grid nothing
    is resized; elsewhere "grid" and "flat" give different, finite results."""
    import cassi.models.zoo.dauhst as d

    torch.manual_seed(0)
    hst = HalfShuffleTransformer(5, 4, dim=4, window=4, frame=(32, 48))
    for p in hst.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    x, g = torch.rand(2, 5, 37, 50), torch.rand(2, 4, 37, 50)
    b = hst(x)
    b.backward(g)
    whole = [p.grad.clone() for p in hst.parameters()]
    monkeypatch.setattr(d, "STRIP_BYTES", 2048)  # many strips at this size
    with torch.no_grad():
        a = hst(x)
    torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(d, "FRESH_BYTES", 0)  # every FFN and windows-only attention: strips recomputed
    hst.zero_grad()
    c = hst(x)
    c.backward(g)
    torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6)
    for (name, p), w in zip(hst.named_parameters(), whole):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-6, msg=name)
    monkeypatch.undo()
    attn = hst.enc[1][0].attn  # scale 1: a 4×6 window grid for 32×48
    table = attn.shuffle_bias.reshape(1, 24, 24)
    assert torch.equal(attn._grid_bias(4, 6, torch.float32), table)
    grid, flat = attn._grid_bias(3, 5, torch.float32), None
    attn.resize = "flat"
    flat = attn._grid_bias(3, 5, torch.float32)
    assert grid.shape == flat.shape == (1, 15, 15) and not torch.allclose(grid, flat)
    # "grid": a table that depends on the query's row only stays so after resizing
    rows = torch.arange(4.0).repeat_interleave(6)
    attn.resize = "grid"
    with torch.no_grad():
        attn.shuffle_bias.copy_(rows[:, None].expand(24, 24).reshape(attn.shuffle_bias.shape))
    got = attn._grid_bias(2, 6, torch.float32)[0]
    assert torch.allclose(got, got[:, :1].expand_as(got)) and torch.allclose(got[::6, 0], torch.tensor([0.5, 2.5]))


# ------------------------------------------------------------------ beyond the toolbox
def small(bands=4, stages=2, cls=DAUHST, seed=0, **kw):
    torch.manual_seed(seed)
    model = cls(bands=bands, stages=stages, dim=4, window=4, frame=(32, 64), **kw)
    for p in model.parameters():  # away from the initialisation's near-identity
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("case", ["31 bands 20×36", "step 1, 64×96", "uneven integer offsets", "a mask per sample"])
def test_geometries_beyond_the_toolbox(case):
    g = torch.Generator().manual_seed(1)
    bands, shape, kw = 4, (16, 24), {"step": 2}
    if case.startswith("31"):
        bands, shape = 31, (20, 36)
    elif case.startswith("step 1"):
        shape, kw = (64, 96), {"step": 1}
    elif case.startswith("uneven"):
        kw = {"offsets": [0, 3, 4, 9]}
    mask = torch.rand(2, 1, *shape, generator=g) if case.startswith("a mask") else torch.rand(*shape, generator=g) > 0.5
    op = CASSI(mask.float(), bands=bands, **kw)
    x = torch.rand(2, bands, *shape, generator=g)
    y = op(x)
    for cls in (DAUHST, DAUHSTReal):
        model = small(bands, cls=cls)
        with torch.no_grad():
            outs = model(op, y, return_stages=True)
            assert len(outs) == 3 and all(o.shape == x.shape for o in outs) and torch.isfinite(outs[-1]).all()
            one = model(op if mask.ndim == 2 else CASSI(mask[1:].float(), bands=bands, **kw), y[1:])
        torch.testing.assert_close(one, outs[-1][1:], rtol=1e-5, atol=1e-6)  # a batch is its samples


@pytest.mark.parametrize("cls", [DAUHST, DAUHSTReal])
def test_axis_h_is_the_transposed_problem(cls):
    g = torch.Generator().manual_seed(2)
    mask = (torch.rand(20, 12, generator=g) > 0.5).float()
    x = torch.rand(2, 4, 20, 12, generator=g)
    op_h = CASSI(mask, bands=4, step=2, axis="h")
    op_w = CASSI(mask.t().contiguous(), bands=4, step=2)
    model = small(cls=cls)
    with torch.no_grad():
        a = model(op_h, op_h(x))
        b = model(op_w, op_w(x.transpose(-1, -2).contiguous()))
    torch.testing.assert_close(a, b.transpose(-1, -2), rtol=1e-5, atol=1e-6)


def test_the_real_variant_takes_fractional_offsets_and_the_simulation_one_refuses_them():
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=4, step=1.5)
    y = op(torch.rand(1, 4, 16, 16))
    with torch.no_grad():
        assert small(cls=DAUHSTReal)(op, y).shape == (1, 4, 16, 16)
    with pytest.raises(ValueError, match=r"^this DAUHST works on the dispersed frame, which needs integer offsets"):
        small()(op, y)
    with pytest.raises(ValueError, match="reconstructs 4 bands but the operator has 5"):
        small()(CASSI(torch.ones(16, 16), bands=5), torch.zeros(1, 1, 16, 24))
    with pytest.raises(ValueError, match=r"frame 30×64 must be a positive multiple of window·2\^\(scales−1\) = 16"):
        DAUHST(bands=4, stages=1, dim=4, window=4, frame=(30, 64))
    with pytest.raises(ValueError, match="resize must be one of"):
        DAUHST(bands=4, stages=1, resize="nearest")


@pytest.mark.parametrize("cls", [DAUHST, DAUHSTReal])
def test_checkpointing_gives_the_same_gradients_and_bf16_runs(cls):
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=4)
    x = torch.rand(2, 4, 16, 16)
    grads = []
    for ckpt in (False, True):
        model = small(cls=cls, checkpointing=ckpt).train()
        (model(op, op(x)) - x).square().mean().backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None and "unused" not in n]
        assert not missing, missing
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = small(cls=cls).train()(op, op(x))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.mean().backward()


def test_a_stage_prior_is_a_pnp_denoiser(tmp_path):
    from cassi.models import load_prior
    from cassi.solvers import GAP

    model = small()
    path = tmp_path / "m.ckpt"
    torch.save({"state_dict": {f"reconstructor.{k}": v for k, v in model.state_dict().items()},
                "cassi": {"model": model.config, "geometry": None, "wavelengths": None}}, path)
    denoiser = load_prior(path)  # the noise level β fills the extra channel
    x = torch.rand(1, 4, 16, 16)
    assert denoiser(x).shape == x.shape and not torch.equal(denoiser(x, 0.0), denoiser(x, 1.0))
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=4)
    assert GAP(denoiser, iters=2)(op, op(x)).x.shape == x.shape


# ------------------------------------------------------------------ configs and training
def test_configs_build_the_toolbox_sizes():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        for method in METHODS:
            cfg = compose("train", overrides=[f"model={method}"])
            model = instantiate(cfg.model)
            assert type(model) is DAUHST and sum(p.numel() for p in model.parameters()) == PARAMS[method]
            assert model.config == toolbox.build(method).config
        cfg = compose("train", overrides=["experiment=toolbox", "model=dauhst_9stg", "model.checkpointing=true"])
    assert cfg.model.checkpointing and cfg.module.loss.kind == "rmse" and cfg.module.optimizer.lr == 4e-4
    assert cfg.trainer.precision == "32-true" and cfg.trainer.max_epochs == 300 and cfg.data.batch_size == 5


def test_a_training_step_through_train_py(tmp_path):
    zc.train_one_step(tmp_path, "model=dauhst_2stg", "model.dim=4", "model.window=4", "model.frame=[16,32]",
                      "module.loss.kind=rmse", threads="1")


# ------------------------------------------------------------------ making the extra references
def _make(which: str, code: str) -> None:
    """Run the toolbox's code (``which``: sim, real or realtest) and store the references this file adds."""
    from cassi.models.zoo import compare

    tb = compare.load_toolbox(code)
    name, method, size = {"sim": ("dauhst_2stg_tables", "dauhst_2stg", 256),
                          "real": ("dauhst_2stg_real", "dauhst_2stg_real", 384),
                          "realtest": ("dauhst_2stg_real_256", "dauhst_2stg_real", 256)}[which]
    seeds = {"scene_seed": 1, "mask_seed": 2, "positions_seed": 3, "weight_seed": 0, "tables_seed": 7, "gain": 20.0}
    x, m = zc.scene((28, size, size), seeds["scene_seed"]), zc.mask((size, size), seeds["mask_seed"])
    ours = with_tables(method, seeds["weight_seed"], seeds["tables_seed"], seeds["gain"])
    net, keys = compare.toolbox_model(tb, method, ours)
    if which == "sim":
        meas, inp_mask, args = compare.toolbox_inputs(tb, method, x, m)
        setting = (args.input_setting, str(args.input_mask))
    else:  # the real-data model takes the measurement as given (no mask): here y = A x
        meas, inp_mask, setting = CASSI(m, bands=28, step=2)(x)[:, 0], None, ("Y", "None")
    with torch.no_grad():
        out = net.eval()(meas, inp_mask)
    ref = {"method": method, "shape": [28, size, size], **seeds, **zc.summary(out, seeds["positions_seed"]),
           "toolbox_keys": keys, "input_setting": setting[0], "input_mask": setting[1]}
    torch.save(ref, zc.REF_DIR / f"{name}.pt")
    print(f"{name}: output {tuple(out.shape)}, peak {ref['peak']:.4g}")


if __name__ == "__main__":
    _make(sys.argv[1], sys.argv[2])
