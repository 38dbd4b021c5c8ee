"""DPU (cassi.models.zoo.dpu): equal to the authors' code (GitHub ZhangJC-2k/DPU; reference made with it by
``PYTHONPATH=<einops> .venv/bin/python tests/make_dpu_reference.py <DPU checkout>``: 2 stages at 28×60, a frame the
authors' code mirror-pads to 32×64, a grey mask, seeded weights; bit for bit in float32, and within 1.8e-6 of the
peak in float64, so that it does not hinge on rounding although the attention's threshold is a hard comparison),
Φ_s summed bit for bit as the authors' data script sums it, a negative control showing that the equality test
catches a wrong weight mapping, conversion of the authors' published checkpoint layout (``{'model': ...}``,
``module.`` prefixes, a numpy PSNR beside it; a plain state dict) and of a truncated file (one error line), the
published configurations, and geometries beyond the authors' code (band counts, frames, steps, offsets, axis h,
batches of masks, bf16 autocast, checkpointing)."""
import ast
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402
from make_dpu_reference import grey_mask, seeded  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models import load_model  # noqa: E402
from cassi.models.zoo import compare, toolbox  # noqa: E402
from cassi.models.zoo.dpu import DPU, _GroupedMLP, _pair_mix, _phi_s, authors_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REF = "dpu_2stg"
STAGES = {"dpu_5stg": 5, "dpu_9stg": 9}


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
    """``model`` on the reference's measurement and mask (the y the authors' code was given)."""
    c = ref["shape"][0]
    with torch.no_grad():
        return model(CASSI(ref["mask"].to(dtype), bands=c, step=2, backend="loop"), ref["y"].to(dtype),
                     return_stages=stages)


def relative_error(out, ref) -> float:
    """max |out − the authors' output| over the whole frame, relative to the authors' peak."""
    return (out[0].double() - ref["out"].double()).abs().max().item() / ref["peak"]


# ------------------------------------------------------------------ equality with the authors' code
def test_equals_the_authors_code(ref):
    c, h, w = ref["shape"]
    assert ref["shape"] == [28, 28, 60] and ref["stages"] == 2
    # the measurement the reference was given is, bit for bit, the one cassi's operator computes from the seeded
    # scene (the threshold's comparisons flip on last-bit changes of y)
    y = CASSI(grey_mask((h, w), ref["mask_seed"]), bands=c, step=2, backend="loop")(zc.scene((c, h, w),
                                                                                            ref["scene_seed"]))
    assert torch.equal(y, ref["y"])
    model = seeded(ref["stages"], ref["weight_seed"])
    assert zc.digest(model.state_dict()) == ref["weights_sha256"]  # the weights the authors' code ran with
    outs = run(ref, model, stages=True)
    assert len(outs) == 2  # one output per stage, the last is the result
    err = relative_error(outs[-1], ref)
    assert err <= 1e-4, f"max error {err:.3g} of the peak"
    zc.assert_matches(outs[-1], ref)
    first = (zc.summary(outs[0])["band_mean"] - ref["first_band_mean"]).abs().max().item()
    assert first <= 1e-4 * ref["peak"], f"first stage's band means differ by {first:.3g}"
    # not only bit for bit: in float64 (every rounding changed) no threshold comparison flips that shows
    err = relative_error(run(ref, model.double(), dtype=torch.float64), ref)
    assert err <= 1e-5, f"float64: max error {err:.3g} of the peak"


def test_the_grouped_convolutions_without_their_loop_equal_pytorchs_bit_for_bit():
    """The MLP's three grouped 1×1 convolutions and the per-band pair mix are computed as products and fused
    sums, not by PyTorch's per-group loop: equal to the convolutions bit for bit (the threshold downstream turns any
    last-bit change into a visible one), and their gradients equal within rounding."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    for dim in (28, 56):
        mlp = _GroupedMLP(dim)
        with torch.no_grad():
            for p in mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        t = (torch.randn(2, 32, 64, dim, generator=g) * 3).requires_grad_()  # tokens, as the LayerNorm gives them

        def convs(t):
            x = F.gelu(mlp.expand(t.permute(0, 3, 1, 2)))
            B, n, H, W = x.shape
            x = F.gelu(mlp.mix(x.reshape(B, dim, 4, H, W).transpose(1, 2).reshape(B, n, H, W)))
            return mlp.project(x.reshape(B, 4, dim, H, W).transpose(1, 2).reshape(B, n, H, W)).permute(0, 2, 3, 1)

        fast, want = mlp(t), convs(t)
        assert torch.equal(fast, want), dim
        (g_fast,), (g_want,) = (torch.autograd.grad(o.square().sum(), t) for o in (fast, want))
        torch.testing.assert_close(g_fast, g_want, rtol=1e-5, atol=1e-5)
        w = torch.randn(dim, 2, 1, 1, generator=g)
        a, b = torch.randn(2, 2, dim, 32, 64, generator=g)
        pair = torch.stack([a, b], dim=2).reshape(2, 2 * dim, 32, 64)  # interleaved: a_0, b_0, a_1, ...
        assert torch.equal(_pair_mix(a, b, w), F.conv2d(pair, w, groups=dim))


def test_phi_s_is_summed_as_the_authors_sum_it(ref):
    """Φ_s bit for bit as the authors' Dataset.py sums it (in float32, over the bands of the placed mask): on a grey
    mask the operator's Φ (summed in float64) differs in the last bit, which the threshold would turn into a change
    of 1.4e-4 of the peak at the authors' 256×256 test frame (9 stages)."""
    op = CASSI(ref["mask"], bands=ref["shape"][0], step=2, backend="loop")
    _, (_, theirs) = compare.authors_inputs("dpu", op, ref["mask"], ref["y"])
    ours = _phi_s(toolbox.shifted_mask(op))
    assert torch.equal(ours, theirs)
    assert not torch.equal(toolbox.phi_s(op), theirs)  # the mask is grey enough to tell the two apart


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
    of every attention swapped; the degradation prior's two same-shaped 1×1 convs, of the features and of the
    masks, swapped) leave the tolerance, by far."""
    model = seeded(ref["stages"], ref["weight_seed"])
    state = model.state_dict()
    wrong(state)
    model.load_state_dict(state)
    out = run(ref, model)
    assert relative_error(out, ref) > 1e-2
    zc.assert_fails_the_check(out, ref)


# ------------------------------------------------------------------ published weights
def _published(ref, method, path, prefix="module.", wrap=True):
    """A checkpoint as the authors' Train.py writes it: {'model': state dict, 'epoch', 'loss', 'psnr' (a numpy
    float64)} (``prefix`` as DataParallel writes; ``wrap=False``: the plain state dict), holding the seeded
    weights of ``method``."""
    model = toolbox.build(method)
    state = toolbox.seeded_state(model, ref["weight_seed"])
    sd = {prefix + k: state[authors_key(k)] for k in zc.stage_keys(ref["authors_keys"], STAGES[method], "mu", 3)}
    torch.save({"model": sd, "epoch": 268, "loss": 0.0123, "psnr": np.float64(39.9)} if wrap else sd, path)
    return state


def test_the_published_layout_converts_and_a_truncated_file_gives_one_line(ref, tmp_path):
    """What ``python scripts/convert_checkpoint.py source=dpu method=dpu_5stg weights=model_5stg.pkl
    out=dpu_5stg.ckpt`` runs (in process: the script itself is run by test_zoo_mst.py; the 5-stage model keeps the
    test short, the methods differ only in their stage count)."""
    script = ast.parse((ROOT / "scripts" / "convert_checkpoint.py").read_text())
    sources = next(ast.literal_eval(n.value) for n in script.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "SOURCES")
    assert "dpu" in sources and all(toolbox.METHODS[m].source == "dpu" for m in STAGES)
    for name, kw in (("model_5stg.pkl", {}), ("plain_5stg.pkl", {"prefix": "", "wrap": False})):
        pkl = tmp_path / name
        state = _published(ref, "dpu_5stg", pkl, **kw)
        model = load_model(toolbox.convert("dpu_5stg", pkl, tmp_path / "dpu_5stg.ckpt"))
        assert type(model) is DPU and model.stages == 5
        assert sum(p.numel() for p in model.parameters()) == ref["params"]["5"]  # the authors' Net(stage=5)
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    info = torch.load(tmp_path / "dpu_5stg.ckpt", weights_only=True)["cassi"]["converted"]
    assert info["source"] == "dpu" and info["method"] == "dpu_5stg"
    # a truncated download: one line naming the file (the script prints it after "error: ")
    bad = tmp_path / "cut.pkl"
    bad.write_bytes(pkl.read_bytes()[: pkl.stat().st_size // 2])
    with pytest.raises(ValueError) as e:
        toolbox.convert("dpu_5stg", bad, tmp_path / "x.ckpt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad} is not a torch state dict"), msg
    assert not (tmp_path / "x.ckpt").exists()
    # another stage count's checkpoint: one line naming what is missing
    with pytest.raises(ValueError, match=r"^\S+ do not fit toolbox method 'dpu_9stg': missing \['layers\.5\.") as e:
        toolbox.convert("dpu_9stg", pkl, tmp_path / "x.ckpt")
    assert "\n" not in str(e.value)


def test_the_methods_build_the_published_configurations(ref):
    for method, k in STAGES.items():
        model = toolbox.build(method)
        assert type(model) is DPU and model.stages == k and model.config["dim"] == 28 and model.bands == 28
        assert sum(p.numel() for p in model.parameters()) == ref["params"][str(k)]
        keys = zc.stage_keys(ref["authors_keys"], k, "mu", 3)
        assert sorted(map(authors_key, keys)) == sorted(model.state_dict())  # one-to-one


# ------------------------------------------------------------------ beyond the authors' code
def small(bands=5, stages=2, seed=0, **kw):
    torch.manual_seed(seed)
    model = DPU(bands=bands, stages=stages, dim=4, window=4, **kw)
    for p in model.parameters():  # away from the initialisation
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("case", zc.GEOMETRIES)
def test_geometries_beyond_the_authors_code(case):
    zc.check_geometry(small, case)


def test_axis_h_is_the_transposed_problem_and_fractional_offsets_are_refused():
    zc.check_axis_h_and_refusals(small(), "DPU")


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


def test_reported_figures_of_dpu_and_ssr_set_beside_a_table():
    """DPU and SSR quote PSNR (and for the largest sizes SSIM) on KAIST; a figure not quoted is left out, not
    invented; a method with none gives no line."""
    from cassi.models.zoo.toolbox import reported_beside

    five = reported_beside("dpu_5stg", 30.0, 0.9, "2 scenes")
    assert five.endswith("its authors report 39.62 dB on KAIST's 10 scenes (the DPU paper (Zhang et al., CVPR 2024), "
                         "as its figures are quoted in cassi's issue 85)")
    assert "40.52 dB / 0.977" in reported_beside("dpu_9stg", 30.0, 0.9, "x")
    assert "40.69 dB / 0.978" in reported_beside("ssr_l", 30.0, 0.9, "x")
    assert reported_beside("ssr_m", 30.0, 0.9, "x") is None
