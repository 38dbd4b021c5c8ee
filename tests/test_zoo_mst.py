"""MST and MST++ as the MST toolbox has them (cassi.models.zoo.mst): equal to the toolbox's output — mst_s / mst_m /
mst_l at 256² (the only frame at which its mask guidance's ``256 // row`` rule holds), mst_plus_plus at 44×60 (its
reflecting pad to 48×64 included), the real-data variants mst_s_real and mst_plus_plus_real at 64² (square, as their
input code needs) —, converted weights, the attention's reformulation, geometries beyond the toolbox's, and a
training step through scripts/train.py.

References: tests/make_zoo_reference.py for the simulation methods; the real-data ones are made by this file,
``PYTHONPATH=<einops> .venv/bin/python tests/test_zoo_mst.py <MST checkout>/real/train_code``.
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
from cassi.models.zoo import mst, toolbox  # noqa: E402
from cassi.models.zoo.mst import MST, MSTPlusPlus, MSTPlusPlusReal, MSTReal  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the toolbox's parameter counts (its models on the CPU: simulation and real-data code)
PARAMS = {"mst_s": 922648, "mst_m": 1487592, "mst_l": 2018156, "mst_plus_plus": 1333950,
          "mst_s_real": 707048, "mst_m_real": 1184184, "mst_l_real": 1630076, "mst_plus_plus_real": 1333166}
SETTINGS = {"mst_s": ("H", "Phi"), "mst_m": ("H", "Phi"), "mst_l": ("H", "Phi"), "mst_plus_plus": ("H", "Mask"),
            "mst_s_real": ("Y", "None"), "mst_plus_plus_real": ("Y", "None")}
REAL_SIZE = 64


def seeded(method: str, seed: int = 0):
    model = toolbox.build(method)
    model.load_state_dict(toolbox.seeded_state(model, seed))
    return model.eval()


def small(cls, bands: int = 8):
    """A small seeded model of ``cls`` (one block per level, one MST in MST++)."""
    kw = {"num_blocks": [1, 1, 1]} if cls in (MST, MSTReal) else {"stages": 1}
    model = cls(bands=bands, **kw)
    model.load_state_dict(toolbox.seeded_state(model, 5))
    return model.eval()


def run(model, op, x):
    with torch.no_grad():
        return model(op, op(x))


# ------------------------------------------------------------------ equality with the toolbox
@pytest.mark.parametrize("method", list(SETTINGS))
def test_equals_the_toolbox(method):
    ref = zc.load_reference(method)
    assert (ref["input_setting"], ref["input_mask"]) == SETTINGS[method]
    model = toolbox.build(method)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[method]
    zc.assert_matches(zc.cassi_output(method, ref), ref)


def test_a_wrong_mapping_fails_the_equality_check():
    """Negative control of test_equals_the_toolbox, on its smallest and quickest reference (mst_plus_plus, 44×60):
    the seeded weights with q and k exchanged in every attention (a key mapping that confuses the toolbox's to_q
    and to_k) leave its tolerance. Only just (1.2× the tolerance at the sampled positions): with these weights the
    attention is nearly uniform, and on mst_s_real (0.9×) and mst_plus_plus_real (0.4×) the swap stays inside it."""
    ref = zc.load_reference("mst_plus_plus")
    model = toolbox.build("mst_plus_plus")
    state = toolbox.seeded_state(model, ref["weight_seed"])
    pairs = [(k, k.replace(".to_q.", ".to_k.")) for k in state if ".to_q." in k]
    assert len(pairs) == sum(isinstance(m, mst._SpectralAttention) for m in model.modules()) > 0
    model.load_state_dict(zc.swapped(state, pairs))
    zc.assert_fails_the_check(zc.cassi_output("mst_plus_plus", ref, model), ref)


def test_parameter_counts_are_the_toolboxs():
    for method, n in PARAMS.items():
        assert sum(p.numel() for p in toolbox.build(method).parameters()) == n, method


def test_converted_weights_load_and_match(tmp_path):
    ref = zc.load_reference("mst_plus_plus")
    pth = zc.toolbox_checkpoint("mst_plus_plus", ref, tmp_path / "mst_plus_plus.pth")
    out = tmp_path / "mst_plus_plus.ckpt"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), "source=mst",
                        "method=mst_plus_plus", f"weights={pth}", f"out={out}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 0, r.stderr[-2000:]
    model = load_model(out)
    assert type(model) is MSTPlusPlus and model.geometry["offsets"] == [2.0 * c for c in range(28)]
    zc.assert_matches(zc.cassi_output("mst_plus_plus", ref, model), ref)
    ref = zc.load_reference("mst_s_real")  # another class, through convert() itself (MST's keys: the equality test)
    pth = zc.toolbox_checkpoint("mst_s_real", ref, tmp_path / "mst_s_real.pth", prefix="")
    model = load_model(toolbox.convert("mst_s_real", pth, tmp_path / "mst_s_real.ckpt"))
    assert type(model) is MSTReal
    zc.assert_matches(zc.cassi_output("mst_s_real", ref, model), ref)


def test_another_methods_weights_are_refused(tmp_path):
    ref = zc.load_reference("mst_s")
    pth = zc.toolbox_checkpoint("mst_s", ref, tmp_path / "mst_s.pth")
    with pytest.raises(ValueError, match="do not fit toolbox method 'mst_m'"):
        toolbox.convert("mst_m", pth, tmp_path / "x.ckpt")


# ------------------------------------------------------------------ the reformulated attention
def direct_attention(att, x, gate=None):
    """MS-MSA written as the paper states it: q, k, v per pixel, L2-normalised over pixels, A = softmax(r·k̂q̂ᵀ)."""
    b, h, w, c = x.shape
    heads, d = att.heads, att.dim_head
    flat = x.reshape(b, h * w, c)
    q, k, v0 = (F.linear(flat, m.weight) for m in (att.to_q, att.to_k, att.to_v))
    v = v0 if gate is None else v0 * gate.reshape(-1, h * w, c)
    q, k, v = (t.reshape(b, h * w, heads, d).permute(0, 2, 3, 1) for t in (q, k, v))  # (B, heads, d, N)
    a = torch.softmax(F.normalize(k, dim=-1) @ F.normalize(q, dim=-1).transpose(-1, -2) * att.rescale, dim=-1)
    o = F.linear((a @ v).permute(0, 3, 1, 2).reshape(b, h * w, c), att.proj.weight, att.proj.bias)
    pos = F.conv2d(F.gelu(F.conv2d(v0.reshape(b, h, w, c).permute(0, 3, 1, 2), att.pos1.weight, padding=1, groups=c)),
                   att.pos2.weight, padding=1, groups=c).permute(0, 2, 3, 1)
    return x + o.view(b, h, w, c) + pos


@pytest.mark.parametrize("c", [28, 56])
def test_the_attention_equals_its_direct_form(c):
    """S = XᵀX about the channel means, the attention folded into the projection: equal to the direct form, also
    for features with large per-channel offsets (a plain Gram matrix would lose digits there)."""
    torch.manual_seed(0)
    att = mst._SpectralAttention(c, 28, guided=False).double()
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0, 0.2)
        att.rescale.fill_(8.0)
    x = torch.randn(2, 24, 20, c, dtype=torch.float64) + 30 * torch.rand(1, 1, 1, c, dtype=torch.float64)
    gate = torch.rand(1, 24, 20, c, dtype=torch.float64)
    with torch.no_grad():
        want = direct_attention(att, x, gate)
        assert torch.allclose(att(x.clone(), gate), want, rtol=0, atol=1e-10 * want.abs().max())
        got32 = att.float()(x.float(), gate.float()).double()
    assert (got32 - want).abs().max() < 2e-5 * want.abs().max()


def test_mask_windows_are_the_toolboxs_at_its_geometry():
    """Channel i of level l reads its mask window from column ⌊2i/4^l⌋ (the toolbox's step 2/down_sample² with
    down_sample = 256 // row, i.e. 2^l at 256²); the same rule from any integer offsets."""
    offsets = [2 * c for c in range(28)]
    for level in range(3):
        n = 28 * 2 ** level
        assert mst.level_shifts(offsets, n, level) == [int(2 / 4 ** level * i) for i in range(n)]
    assert mst.level_shifts([3 * c for c in range(5)], 10, 1) == [int(3 * i / 4) for i in range(10)]
    assert mst.level_shifts([0, 1, 5], 6, 1) == [0, 0, 0, 1, 2, 3]  # interpolated, extrapolated, halved


# ------------------------------------------------------------------ beyond the toolbox
@pytest.mark.parametrize("cls", [MST, MSTPlusPlus, MSTReal, MSTPlusPlusReal])
def test_other_band_counts_and_frames_run(cls):
    torch.manual_seed(1)
    model = small(cls, bands=31)
    op = CASSI(torch.rand(50, 70) > 0.5, bands=31, step=2)  # 50×70: padded inside, cropped back
    out = run(model, op, torch.rand(1, 31, 50, 70))
    assert out.shape == (1, 31, 50, 70) and torch.isfinite(out).all()


@pytest.mark.parametrize("cls", [MST, MSTPlusPlus, MSTReal])
def test_axis_h_is_the_transposed_problem(cls):
    torch.manual_seed(2)
    model = small(cls)
    m, x = (torch.rand(24, 32) > 0.5).float(), torch.rand(2, 8, 24, 32)
    op_h, op_w = CASSI(m, bands=8, step=2, axis="h"), CASSI(m.T.contiguous(), bands=8, step=2)
    got, want = run(model, op_h, x), run(model, op_w, x.transpose(-1, -2).contiguous()).transpose(-1, -2)
    assert got.shape == x.shape and torch.allclose(got, want, atol=1e-5 * want.abs().max())


@pytest.mark.parametrize("cls", [MST, MSTPlusPlus])
def test_each_sample_uses_its_own_mask(cls):
    """One mask per sample (B, C, H, W): sample i is reconstructed as with its own mask alone (the toolbox gates
    the whole batch with the first sample's mask); a shared mask broadcasts over the batch."""
    torch.manual_seed(3)
    model = small(cls)
    masks, x = (torch.rand(2, 8, 16, 24) > 0.5).float(), torch.rand(2, 8, 16, 24)
    got = run(model, CASSI(masks, step=2), x)
    for i in range(2):
        want = run(model, CASSI(masks[i], step=2), x[i:i + 1])
        assert torch.allclose(got[i:i + 1], want, atol=1e-5 * want.abs().max())
    shared = CASSI(masks[0, 0], bands=8, step=2)
    both = run(model, shared, x)
    assert torch.allclose(both[1:], run(model, shared, x[1:]), atol=1e-5 * both.abs().max())


def test_fractional_offsets_are_refused_by_mst_only():
    op = CASSI(torch.rand(16, 16) > 0.5, bands=8, step=1.5)
    with pytest.raises(ValueError, match="needs integer offsets"):
        run(small(MST), op, torch.rand(1, 8, 16, 16))
    for cls in (MSTPlusPlus, MSTReal, MSTPlusPlusReal):  # they start from the operator's shift-back (H)
        out = run(small(cls), op, torch.rand(1, 8, 16, 16))
        assert out.shape == (1, 8, 16, 16) and torch.isfinite(out).all()


def test_refusals_are_one_line():
    for model, size, what in ((small(MST), (3, 20), "at least 4×4"), (small(MSTPlusPlus), (7, 20), "at least 8×8")):
        op = CASSI(torch.ones(size), bands=8, step=2)
        with pytest.raises(ValueError, match=what) as e:
            run(model, op, torch.rand(1, 8, *size))
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="dim must equal bands"):
        MST(bands=28, dim=32)
    with pytest.raises(ValueError, match="stage \\+ 1 = 3 entries"):
        MST(bands=28, num_blocks=[2, 2])
    with pytest.raises(ValueError, match="reconstructs 8 bands"):
        run(small(MST), CASSI(torch.ones(16, 16), bands=6, step=2), torch.rand(1, 6, 16, 16))


def test_banded_inference_equals_the_whole_frame(monkeypatch):
    """Without autograd the feed-forwards run in bands of rows (and S over chunks of pixels): the same output as
    the whole-frame pass that training takes."""
    torch.manual_seed(4)
    model = small(MST)
    op = CASSI(torch.rand(32, 40) > 0.5, bands=8, step=2)
    y = op(torch.rand(2, 8, 32, 40))
    whole = model(op, y).detach()
    monkeypatch.setattr(mst, "_CHUNK_BYTES", 8 * 1024)  # a few rows per band at every level
    with torch.no_grad():
        banded = model(op, y)
    assert torch.allclose(banded, whole, atol=1e-5 * whole.abs().max())


def test_checkpointing_gives_the_same_gradients():
    torch.manual_seed(5)
    model = small(MST)
    op = CASSI(torch.rand(16, 16) > 0.5, bands=8, step=2)
    x = torch.rand(2, 8, 16, 16)
    grads = []
    for flag in (False, True):
        model.checkpointing = flag
        model.zero_grad()
        (model(op, op(x)) - x).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6 * (b.abs().max() + 1e-12))


@pytest.mark.parametrize("cls", [MST, MSTPlusPlus])
def test_bf16_autocast_stays_close(cls, monkeypatch):
    monkeypatch.setattr(mst, "_CHUNK_BYTES", 16 * 1024)  # the banded inference path too
    torch.manual_seed(6)
    model = small(cls)
    op = CASSI(torch.rand(32, 32) > 0.5, bands=8, step=2)
    x = torch.rand(1, 8, 32, 32)
    want = run(model, op, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(model, op, x)
        loss = (model.train()(op, op(x)) - x).square().mean()
    assert got.dtype == torch.float32 and (got - want).abs().max() < 3e-2 * want.abs().max()
    loss.backward()  # training under autocast: gradients for every parameter, finite
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_real_variants_scale_the_measurement_to_peak():
    torch.manual_seed(7)
    plain, peaked = small(MSTReal), MSTReal(bands=8, num_blocks=[1, 1, 1], peak=0.8)
    peaked.load_state_dict(plain.state_dict())
    op = CASSI(torch.rand(16, 16) > 0.5, bands=8, step=2)
    y = op(torch.rand(2, 8, 16, 16))
    with torch.no_grad():
        want = plain.eval()(op, y * (0.8 / y.amax(dim=(1, 2, 3), keepdim=True)))
        assert torch.allclose(peaked.eval()(op, y), want, atol=1e-6 * want.abs().max())
    with pytest.raises(ValueError, match="peak must be > 0"):
        MSTPlusPlusReal(bands=8, peak=0)


# ------------------------------------------------------------------ training through scripts/train.py
def test_a_training_step_through_train_py(tmp_path):
    zc.train_one_step(tmp_path, "model=mst_s", "model.num_blocks=[1,1,1]", "module.loss.kind=rmse")


def test_the_experiments_compose_the_toolboxs_protocol():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        mst_cfg = compose("train", overrides=["experiment=toolbox", "model=mst_m", "schedule=toolbox_mst"])
        plus = compose("train", overrides=["experiment=toolbox", "model=mst_plus_plus"])
    assert mst_cfg.model.num_blocks == [2, 4, 4] and mst_cfg.model._target_.endswith("MST")
    assert mst_cfg.module.scheduler.milestones == [50, 100, 150, 200, 250] and mst_cfg.module.scheduler.gamma == 0.5
    assert plus.model._target_.endswith("MSTPlusPlus") and plus.module.scheduler.min_lr == 1e-6
    for cfg in (mst_cfg, plus):
        assert cfg.module.optimizer.lr == 4e-4 and cfg.module.loss.kind == "rmse" and cfg.data.batch_size == 5


# ------------------------------------------------------------------ making the real-data references
def _make(code: str) -> None:
    """Run the toolbox's real-data code (real/train_code) and store mst_s_real.pt and mst_plus_plus_real.pt: its
    models take the measurement as given, (B, H, W+Δ), here y = A x."""
    from cassi.models.zoo import compare

    tb = compare.load_toolbox(code)
    for method in ("mst_s_real", "mst_plus_plus_real"):
        net = (tb.architecture.MST(dim=28, stage=2, num_blocks=[2, 2, 2]) if method == "mst_s_real" else
               tb.architecture.MST_Plus_Plus(in_channels=28, out_channels=28, n_feat=28, stage=3))
        seeds = {"scene_seed": 1, "mask_seed": 2, "positions_seed": 3, "weight_seed": 0}
        x = zc.scene((28, REAL_SIZE, REAL_SIZE), seeds["scene_seed"])
        m = zc.mask((REAL_SIZE, REAL_SIZE), seeds["mask_seed"])
        ours = seeded(method, seeds["weight_seed"])
        state, rename = ours.state_dict(), toolbox.METHODS[method].rename
        keys = list(net.state_dict())
        net.load_state_dict({k: state[rename(k)] for k in keys}, strict=True)
        with torch.no_grad():
            out = net.eval()(CASSI(m, bands=28, step=2)(x)[:, 0])
        ref = {"method": method, "shape": [28, REAL_SIZE, REAL_SIZE], **seeds,
               **zc.summary(out, seeds["positions_seed"]), "toolbox_keys": keys, "input_setting": "Y",
               "input_mask": "None"}
        torch.save(ref, zc.REF_DIR / f"{method}.pt")
        print(f"{method}: output {tuple(out.shape)}, peak {ref['peak']:.4g}")


if __name__ == "__main__":
    _make(sys.argv[1])


# ------------------------------------------------------------------ a paper's table in one command
def test_a_converted_model_on_the_kaist_layout_is_scored_beside_its_authors_figures(tmp_path, capsys):
    """`evaluate.py data=cave_kaist ckpt=<converted mst_s>` on stand-in scenes in KAIST's layout: the published
    tables' PSNR and SSIM per scene, and their means set beside what the MST authors report (34.26 dB / 0.935)."""
    import json

    import numpy as np

    from cassi.io import save_cube, save_mask

    g = np.random.default_rng(0)
    for split, n in (("train", 1), ("val", 1), ("test", 2)):
        (tmp_path / "data" / "cave_kaist" / split).mkdir(parents=True)
        for i in range(n):
            save_cube(tmp_path / "data" / "cave_kaist" / split / f"scene{i + 1:02d}.h5",
                      g.random((28, 32, 32), np.float32))
    save_mask(tmp_path / "data" / "cave_kaist" / "mask_256.mat", (g.random((32, 32)) > 0.5).astype(np.float32))
    ckpt = toolbox.convert("mst_s", zc.toolbox_checkpoint("mst_s", zc.load_reference("mst_s"), tmp_path / "m.pth"),
                           tmp_path / "mst_s.ckpt")
    from hydra import compose, initialize_config_dir

    from cassi.workflows.evaluate import evaluate

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):  # what the script composes, in this process
        cfg = compose("evaluate", overrides=[
            "data=cave_kaist", f"ckpt={ckpt}", f"paths.data_dir={tmp_path / 'data'}", "data.test.crop_to=32",
            "data.num_workers=0", "trainer.accelerator=cpu", "data_name=cave_kaist", f"paths.output_dir={tmp_path / 'out'}"])
    evaluate(cfg)
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["name"] for s in res["scenes"]] == ["scene01", "scene02"]
    line = (f"mst_s: {res['mean']['psnr_table']:.2f} dB / SSIM {res['mean']['ssim_table']:.3f} here (cave_kaist, "
            f"2 scenes); its authors report 34.26 dB / 0.935 on KAIST's 10 scenes")
    assert line in " ".join(out.split()) and line in (tmp_path / "out" / "results.md").read_text()
