"""DPU (cassi.models.zoo.dpu): equal to the authors' code (GitHub ZhangJC-2k/DPU; reference made with it by
``PYTHONPATH=<einops> .venv/bin/python tests/make_dpu_reference.py <DPU checkout>``: 2 stages at 64×64, seeded
weights; bit for bit in float32, and within 1e-5 of the peak in float64, so that it does not hinge on rounding
although the attention's threshold is a hard comparison), a negative control showing that the equality test
catches a wrong weight mapping, conversion of the authors' published checkpoint layout (``{'model': ...}`` with
``module.`` prefixes and a numpy PSNR beside it) and of a truncated file (one error line), the published
configurations, and geometries beyond the authors' code."""
import ast
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402
from make_dpu_reference import authors_keys, seeded  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models import load_model  # noqa: E402
from cassi.models.zoo import toolbox  # noqa: E402
from cassi.models.zoo.dpu import DPU, authors_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REF = "dpu_2stg"


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the reference was made (and as pytest-xdist workers should run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ref():
    return zc.load_reference(REF)


def run(ref, model, stages=False, dtype=torch.float32):
    """``model`` on the reference's scene and mask, the measurement computed by cassi's operator in float32."""
    c, h, w = ref["shape"]
    mask = zc.mask((h, w), ref["mask_seed"])
    y = CASSI(mask, bands=c, step=2, backend="loop")(zc.scene((c, h, w), ref["scene_seed"]))  # as the reference's
    with torch.no_grad():
        return model(CASSI(mask.to(dtype), bands=c, step=2, backend="loop"), y.to(dtype), return_stages=stages)


# ------------------------------------------------------------------ equality with the authors' code
def test_equals_the_authors_code(ref):
    assert ref["shape"] == [28, 64, 64] and ref["stages"] == 2
    model = seeded(ref["stages"], ref["weight_seed"])
    outs = run(ref, model, stages=True)
    assert len(outs) == 2  # one output per stage, the last is the result
    zc.assert_matches(outs[-1], ref)
    err = (zc.summary(outs[0])["band_mean"] - ref["first_band_mean"]).abs().max().item()
    assert err <= 1e-4 * ref["peak"], f"first stage's band means differ by {err:.3g}"
    # not only bit for bit: in float64 (every rounding changed) no threshold comparison flips that shows
    zc.assert_matches(run(ref, model.double(), dtype=torch.float64).float(), ref, tol=1e-5)


def _swap_q_k(state):
    for k, v in state.items():
        if k.endswith("attn.qk.weight"):
            state[k] = torch.cat(v.chunk(2)[::-1])


def _swap_gate_and_fuse(state):
    for k in [k for k in state if k.endswith("degradation.gate.weight")]:
        other = k.replace(".gate.", ".fuse.")
        state[k], state[other] = state[other], state[k]


@pytest.mark.parametrize("wrong", [_swap_q_k, _swap_gate_and_fuse], ids=["q and k swapped", "gate and fuse swapped"])
def test_a_wrong_mapping_fails_the_equality_test(ref, wrong):
    """The negative control: the same seeded weights loaded under a wrong mapping of the authors' keys (q and k
    of every attention swapped; the degradation prior's two same-shaped 1×1 convs swapped) leave the tolerance."""
    model = seeded(ref["stages"], ref["weight_seed"])
    state = model.state_dict()
    wrong(state)
    model.load_state_dict(state)
    with pytest.raises(AssertionError, match="max error"):
        zc.assert_matches(run(ref, model), ref)


# ------------------------------------------------------------------ published weights
def _published(ref, method, path, stages):
    """A checkpoint as the authors' Train.py writes it: {'model': DataParallel state dict, 'epoch', 'loss',
    'psnr' (a numpy float64)}, holding the seeded weights of ``method``."""
    model = toolbox.build(method)
    state = toolbox.seeded_state(model, ref["weight_seed"])
    keys = authors_keys(ref["authors_keys"], stages)
    torch.save({"model": {"module." + k: state[authors_key(k)] for k in keys}, "epoch": 268, "loss": 0.0123,
                "psnr": np.float64(39.9)}, path)
    return state


def test_the_published_layout_converts_and_a_truncated_file_gives_one_line(ref, tmp_path):
    """What ``python scripts/convert_checkpoint.py source=dpu method=dpu_9stg weights=model_9stg.pkl
    out=dpu_9stg.ckpt`` runs (in process: the script itself is run by test_zoo_mst.py)."""
    pkl = tmp_path / "model_9stg.pkl"
    state = _published(ref, "dpu_9stg", pkl, 9)
    script = ast.parse((ROOT / "scripts" / "convert_checkpoint.py").read_text())
    sources = next(ast.literal_eval(n.value) for n in script.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "SOURCES")
    assert "dpu" in sources and toolbox.METHODS["dpu_9stg"].source == "dpu"
    model = load_model(toolbox.convert("dpu_9stg", pkl, tmp_path / "dpu_9stg.ckpt"))
    assert type(model) is DPU and model.stages == 9
    assert sum(p.numel() for p in model.parameters()) == ref["params"]["9"]  # the authors' Net(stage=9)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    info = torch.load(tmp_path / "dpu_9stg.ckpt", weights_only=True)["cassi"]["converted"]
    assert info["source"] == "dpu" and info["method"] == "dpu_9stg"
    # a truncated download: one line naming the file (the script prints it after "error: ")
    bad = tmp_path / "cut.pkl"
    bad.write_bytes(pkl.read_bytes()[: pkl.stat().st_size // 2])
    with pytest.raises(ValueError) as e:
        toolbox.convert("dpu_9stg", bad, tmp_path / "x.ckpt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad} is not a torch state dict"), msg
    assert not (tmp_path / "x.ckpt").exists()


def test_the_methods_build_the_published_configurations(ref):
    for k in (5, 9):
        model = toolbox.build(f"dpu_{k}stg")
        assert type(model) is DPU and model.stages == k and model.config["dim"] == 28 and model.bands == 28
        assert sum(p.numel() for p in model.parameters()) == ref["params"][str(k)]
        assert toolbox.METHODS[f"dpu_{k}stg"].source == "dpu"
        keys = authors_keys(ref["authors_keys"], k)
        assert sorted(map(authors_key, keys)) == sorted(model.state_dict())  # one-to-one


# ------------------------------------------------------------------ beyond the authors' code
def small(bands=5, stages=2, seed=0, **kw):
    torch.manual_seed(seed)
    model = DPU(bands=bands, stages=stages, dim=4, window=4, **kw)
    for p in model.parameters():  # away from the initialisation
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("case", ["31 bands 9×14", "step 1", "uneven offsets", "a mask per sample", "1×3 frame"])
def test_geometries_beyond_the_authors_code(case):
    g = torch.Generator().manual_seed(1)
    bands, shape, kw = 5, (12, 20), {"step": 2}
    if case.startswith("31"):
        bands, shape = 31, (9, 14)
    elif case == "step 1":
        kw = {"step": 1}
    elif case.startswith("uneven"):
        kw = {"offsets": [0, 3, 4, 9, 1]}
    elif case.startswith("1×3"):
        shape = (1, 3)
    mask = torch.rand(2, 1, *shape, generator=g) if case.startswith("a mask") else torch.rand(*shape, generator=g)
    kw["backend"] = "loop"  # the operator only makes y here: no backend selection per geometry
    op = CASSI(mask, bands=bands, **kw)
    x = torch.rand(2, bands, *shape, generator=g)
    y = op(x)
    model = small(bands)
    with torch.no_grad():
        outs = model(op, y, return_stages=True)
        assert len(outs) == 2 and all(o.shape == x.shape for o in outs) and torch.isfinite(outs[-1]).all()
        one = model(op if mask.ndim == 2 else CASSI(mask[1:], bands=bands, **kw), y[1:])
    torch.testing.assert_close(one, outs[-1][1:], rtol=1e-4, atol=1e-5)  # a batch is its samples (rounding aside)


def test_axis_h_is_the_transposed_problem_and_fractional_offsets_are_refused():
    g = torch.Generator().manual_seed(2)
    mask = (torch.rand(20, 12, generator=g) > 0.5).float()
    x = torch.rand(1, 5, 20, 12, generator=g)
    op_h = CASSI(mask, bands=5, step=2, axis="h", backend="loop")
    op_w = CASSI(mask.t().contiguous(), bands=5, step=2, backend="loop")
    model = small()
    with torch.no_grad():
        a = model(op_h, op_h(x))
        b = model(op_w, op_w(x.transpose(-1, -2).contiguous()))
    torch.testing.assert_close(a, b.transpose(-1, -2), rtol=1e-5, atol=1e-6)
    op = CASSI(mask, bands=5, step=1.5, backend="loop")
    with pytest.raises(ValueError, match=r"^this DPU works on the dispersed frame, which needs integer offsets"):
        model(op, op(x))
    with pytest.raises(ValueError, match="reconstructs 5 bands but the operator has 4"):
        model(CASSI(mask, bands=4), torch.zeros(1, 1, 20, 18))


def test_checkpointing_gives_the_same_gradients_and_bf16_runs():
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=5, backend="loop")
    x = torch.rand(2, 5, 16, 16)
    grads = []
    for ckpt in (False, True):
        model = small(stages=1, checkpointing=ckpt).train()
        (model(op, op(x)) - x).square().mean().backward()
        missing = {n for n, p in model.named_parameters() if p.grad is None}
        # the threshold's maps get no gradient (a hard comparison), in the authors' code too: they stay as built
        assert missing == {n for n, _ in model.named_parameters() if ".attn.theta_" in n}, missing
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = small(stages=1).train()(op, op(x))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
