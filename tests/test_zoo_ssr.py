"""SSR (cassi.models.zoo.ssr): equal to the authors' code (GitHub ZhangJC-2k/SSR; reference made with it by
``PYTHONPATH=<einops> .venv/bin/python tests/make_ssr_reference.py <SSR checkout>``: SSR-S (3 stages) at 40×64,
a frame the authors' code pads to 48 rows and windows unevenly, seeded weights; bit for bit in float32, within
5.1e-6 of the peak in float64), a negative control showing that the equality test catches a wrong weight mapping,
conversion of the authors' published checkpoint layout (``{'model': ...}``, ``module.`` prefixes, a numpy PSNR
beside it) and of a truncated file (one error line), the published configurations, and geometries beyond the
authors' code."""
import ast
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402
from make_ssr_reference import STAGES, seeded  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models import load_model  # noqa: E402
from cassi.models.zoo import toolbox  # noqa: E402
from cassi.models.zoo.ssr import SSR, authors_key, prior_side  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REF = "ssr_s"


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
    assert ref["shape"] == [28, 40, 64] and ref["stages"] == 3 and ref["method"] == "ssr_s"
    # the measurement the reference was given is the one cassi's operator computes from the seeded scene
    y = CASSI(zc.mask((h, w), ref["mask_seed"]), bands=c, step=2, backend="loop")(zc.scene((c, h, w),
                                                                                         ref["scene_seed"]))
    torch.testing.assert_close(y, ref["y"], rtol=0, atol=1e-6)
    model = seeded(ref["stages"], ref["weight_seed"])
    assert zc.digest(model.state_dict()) == ref["weights_sha256"]  # the weights the authors' code ran with
    outs = run(ref, model, stages=True)
    assert len(outs) == 3  # one output per stage, the last is the result
    err = relative_error(outs[-1], ref)
    assert err <= 1e-4, f"max error {err:.3g} of the peak"
    zc.assert_matches(outs[-1], ref)
    first = (zc.summary(outs[0])["band_mean"] - ref["first_band_mean"]).abs().max().item()
    assert first <= 1e-4 * ref["peak"], f"first stage's band means differ by {first:.3g}"


def _swap_q_k(state):
    for k, v in state.items():
        if k.endswith("attn.qkv.weight"):
            q, kk, vv = v.chunk(3)
            state[k] = torch.cat([kk, q, vv])


def _swap_embeddings(state):
    for k in [k for k in state if k.endswith("prior.embed.weight")]:
        other = k.replace(".embed.", ".embed_mask.")
        state[k], state[other] = state[other], state[k]


@pytest.mark.parametrize("wrong", [_swap_q_k, _swap_embeddings], ids=["q and k swapped", "embeddings swapped"])
def test_a_wrong_mapping_fails_the_equality_test(ref, wrong):
    """The negative control: the same seeded weights loaded under a wrong mapping of the authors' keys (q and k
    of every attention swapped; the prior's two same-shaped 3×3 embeddings of z and of the mask swapped) leave
    the tolerance, by far."""
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
    sd = {prefix + k: state[authors_key(k)] for k in zc.stage_keys(ref["authors_keys"], STAGES[method], "rhos", 2)}
    torch.save({"model": sd, "epoch": 300, "loss": 0.0123, "psnr": np.float64(40.1)} if wrap else sd, path)
    return state


def test_the_published_layout_converts_and_a_truncated_file_gives_one_line(ref, tmp_path):
    """What ``python scripts/convert_checkpoint.py source=ssr method=ssr_s weights=model_S.pkl out=ssr_s.ckpt``
    runs (in process: the script itself is run by test_zoo_mst.py; SSR-S keeps the test short, the methods differ
    only in their stage count)."""
    script = ast.parse((ROOT / "scripts" / "convert_checkpoint.py").read_text())
    sources = next(ast.literal_eval(n.value) for n in script.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "SOURCES")
    assert "ssr" in sources and all(toolbox.METHODS[m].source == "ssr" for m in STAGES)
    for name, kw in (("model_S.pkl", {}), ("plain_S.pkl", {"prefix": "", "wrap": False})):
        pkl = tmp_path / name
        state = _published(ref, "ssr_s", pkl, **kw)
        model = load_model(toolbox.convert("ssr_s", pkl, tmp_path / "ssr_s.ckpt"))
        assert type(model) is SSR and model.stages == 3
        assert sum(p.numel() for p in model.parameters()) == ref["params"]["ssr_s"]  # the authors' Net(stage=3)
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    info = torch.load(tmp_path / "ssr_s.ckpt", weights_only=True)["cassi"]["converted"]
    assert info["source"] == "ssr" and info["method"] == "ssr_s"
    # a truncated download: one line naming the file (the script prints it after "error: ")
    bad = tmp_path / "cut.pkl"
    bad.write_bytes(pkl.read_bytes()[: pkl.stat().st_size // 2])
    with pytest.raises(ValueError) as e:
        toolbox.convert("ssr_s", bad, tmp_path / "x.ckpt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad} is not a torch state dict"), msg
    assert not (tmp_path / "x.ckpt").exists()
    # another stage count's checkpoint: one line naming what is missing
    with pytest.raises(ValueError, match=r"^\S+ do not fit toolbox method 'ssr_m': missing \['layers\.3\.") as e:
        toolbox.convert("ssr_m", pkl, tmp_path / "x.ckpt")
    assert "\n" not in str(e.value)


def test_the_methods_build_the_published_configurations(ref):
    for method, k in STAGES.items():
        model = toolbox.build(method)
        assert type(model) is SSR and model.stages == k and model.config["dim"] == 28 and model.bands == 28
        assert sum(p.numel() for p in model.parameters()) == ref["params"][method]
        keys = zc.stage_keys(ref["authors_keys"], k, "rhos", 2)
        assert sorted(map(authors_key, keys)) == sorted(model.state_dict())  # one-to-one


# ------------------------------------------------------------------ beyond the authors' code
def test_the_prior_pads_as_the_authors_wherever_their_code_runs():
    # the authors pad to 16; the bottleneck (a quarter) must split into equal windows of about 8
    assert [prior_side(n) for n in (256, 660, 64, 40, 48, 80, 144, 33)] == [256, 672, 64, 48, 48, 80, 144, 48]
    # where their code fails (a bottleneck of 4, 28, 44 ... pixels), cassi pads to 32 instead
    assert [prior_side(n) for n in (1, 16, 112, 176, 200)] == [32, 32, 128, 192, 224]


def small(bands=5, stages=2, seed=0, **kw):
    torch.manual_seed(seed)
    model = SSR(bands=bands, stages=stages, dim=4, window=4, **kw)
    for p in model.parameters():  # away from the initialisation
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("case", zc.GEOMETRIES)
def test_geometries_beyond_the_authors_code(case):
    zc.check_geometry(small, case)


def test_axis_h_is_the_transposed_problem_and_fractional_offsets_are_refused():
    zc.check_axis_h_and_refusals(small(), "SSR")


def test_checkpointing_gives_the_same_gradients_and_bf16_runs():
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=5, backend="loop")
    x = torch.rand(2, 5, 16, 16)
    grads = []
    for ckpt in (False, True):
        model = small(stages=1, checkpointing=ckpt).train()
        (model(op, op(x)) - x).square().mean().backward()
        assert all(p.grad is not None for p in model.parameters())  # every weight is trained
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = small(stages=1).train()(op, op(x))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
