"""SAUNet (cassi.models.zoo.saunet): equal to the authors' code (GitHub hustvl/SAUNet; reference made with it by
``.venv/bin/python tests/make_saunet_reference.py <SAUNet checkout>``: 1 and 2 stages at 9×9, the smallest frame
their code runs at, seeded weights stored as their seed and sha256), a negative control showing that the equality
test catches a wrong weight mapping, conversion of the authors' released layout (a plain state dict, also with
``module.`` prefixes) end to end and of a truncated file (one error line), the published configurations, and
geometries beyond the authors' code."""
import ast
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402
from make_saunet_reference import checksum, seeded  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models import load_model  # noqa: E402
from cassi.models.zoo import toolbox  # noqa: E402
from cassi.models.zoo.saunet import DROP_RATES, SAUNet, authors_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4  # of the output's peak


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the reference was made (and as pytest-xdist workers should run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ref():
    return zc.load_reference("saunet_1stg")


def measure(ref):
    """(op, y): the reference's mask in cassi's operator, and y = op(x) on its scene, as the reference's y was made."""
    c, h, w = ref["shape"]
    op = CASSI(ref["mask"], bands=c, step=2, backend="loop")
    return op, op(ref["scene"][None])


def error(out, expected) -> float:
    """max |out − expected| / peak of expected."""
    return ((out[0].double() - expected.double()).abs().max() / expected.abs().max()).item()


def authors_keys(ref, stages: int) -> list[str]:
    """The authors' state-dict keys of a ``stages``-stage SAUNet, from those of their 2-stage model."""
    keys = ref["authors_keys_2stg"]
    out = [k for k in keys if not k.startswith(("denoisers.", "gamma."))]
    out += [f"gamma.{i}" for i in range(stages - 1)]
    one = [k[len("denoisers.0."):] for k in keys if k.startswith("denoisers.0.")]
    return out + [f"denoisers.{s}.{k}" for s in range(stages) for k in one]


# ------------------------------------------------------------------ equality with the authors' code
@pytest.mark.parametrize("stages", [1, 2])
def test_equals_the_authors_code(ref, stages):
    assert ref["shape"] == [28, 9, 9]
    model = seeded(stages, ref["weight_seed"])
    keys = ref[f"authors_keys_{stages}stg"]
    assert checksum(model.state_dict(), keys) == ref[f"sha256_{stages}stg"]  # the weights the authors' code ran
    op, y = measure(ref)
    torch.testing.assert_close(y[0], ref["y"], rtol=0, atol=1e-6)  # the measurement the authors' code got
    with torch.no_grad():
        outs = model(op, y, return_stages=True)
    assert len(outs) == stages and outs[-1].shape == (1, 28, 9, 9)
    err = error(outs[-1], ref[f"output_{stages}stg"])
    assert err <= TOL, f"max error {err:.3g} of the peak"


def _swap(state, a, b):
    for k in [k for k in state if f".{a}." in k]:
        other = k.replace(f".{a}.", f".{b}.")
        state[k], state[other] = state[other], state[k]


@pytest.mark.parametrize("pair", [("value", "mod_in"), ("value", "proj")])
def test_a_wrong_mapping_fails_the_equality_test(ref, pair):
    """The negative control: the same seeded weights loaded under a wrong mapping of the authors' keys (two
    same-shaped 1×1 convs of every block swapped: ``attn.v`` with ``attn.a.0`` or with ``attn.proj``) leave the
    tolerance by more than ten times."""
    model = seeded(1, ref["weight_seed"])
    state = {k: v.clone() for k, v in model.state_dict().items()}  # copies: load_state_dict copies in place
    _swap(state, *pair)
    model.load_state_dict(state)
    op, y = measure(ref)
    with torch.no_grad():
        err = error(model(op, y), ref["output_1stg"])
    assert err > 10 * TOL, f"a wrong mapping moved the output by only {err:.3g} of the peak"


# ------------------------------------------------------------------ published weights
def test_the_released_layout_converts_end_to_end_and_a_truncated_file_gives_one_line(ref, tmp_path):
    """What ``python scripts/convert_checkpoint.py source=saunet method=saunet_1stg weights=<pth> out=<ckpt>``
    runs (in process: the script itself is run by test_zoo_mst.py): the authors' ``model.state_dict()`` as their
    ``checkpoint()`` saves it, once plain and once with DataParallel's ``module.`` prefixes; the converted model
    loads and equals the authors' output."""
    script = ast.parse((ROOT / "scripts" / "convert_checkpoint.py").read_text())
    sources = next(ast.literal_eval(n.value) for n in script.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "SOURCES")
    assert "saunet" in sources and toolbox.METHODS["saunet_1stg"].source == "saunet"
    state = seeded(1, ref["weight_seed"]).state_dict()
    op, y = measure(ref)
    for prefix in ("", "module."):
        pth = tmp_path / f"1stg_model_epoch_284_{prefix or 'plain.'}pth"
        torch.save({prefix + k: state[authors_key(k)] for k in ref["authors_keys_1stg"]}, pth)
        ckpt = toolbox.convert("saunet_1stg", pth, tmp_path / "saunet_1stg.ckpt")
        model = load_model(ckpt)
        assert type(model) is SAUNet and model.stages == 1
        with torch.no_grad():
            assert error(model(op, y), ref["output_1stg"]) <= TOL
    info = torch.load(ckpt, weights_only=True)["cassi"]["converted"]
    assert info["source"] == "saunet" and info["method"] == "saunet_1stg"
    # a truncated download: one line naming the file (the script prints it after "error: ")
    bad = tmp_path / "cut.pth"
    bad.write_bytes(pth.read_bytes()[: pth.stat().st_size // 2])
    with pytest.raises(ValueError) as e:
        toolbox.convert("saunet_1stg", bad, tmp_path / "x.ckpt")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{bad} is not a torch state dict"), msg
    assert not (tmp_path / "x.ckpt").exists()
    # another stage count's checkpoint: one line naming what does not fit
    with pytest.raises(ValueError, match=r"do not fit toolbox method 'saunet_2stg': missing \['priors\.1\.") as e:
        toolbox.convert("saunet_2stg", pth, tmp_path / "y.ckpt")
    assert "\n" not in str(e.value)


def test_a_released_many_stage_checkpoint_converts(ref, tmp_path, stages=3):
    method = f"saunet_{stages}stg"
    model = toolbox.build(method)
    state = toolbox.seeded_state(model, 1)
    keys = authors_keys(ref, stages)
    pth = tmp_path / "model.pth"
    torch.save({"module." + k: state[authors_key(k)] for k in keys}, pth)
    loaded = load_model(toolbox.convert(method, pth, tmp_path / f"{method}.ckpt"))
    assert type(loaded) is SAUNet and loaded.stages == stages
    assert sum(p.numel() for p in loaded.parameters()) == ref["params"][str(stages)]  # the authors' SAUNet(K)
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())


def test_the_methods_build_the_published_configurations(ref):
    for k in (1, 2):  # the stored key lists: the mapping is one-to-one
        assert authors_keys(ref, k) == ref[f"authors_keys_{k}stg"]
        assert sorted(map(authors_key, ref[f"authors_keys_{k}stg"])) == sorted(toolbox.build(f"saunet_{k}stg")
                                                                               .state_dict())
    for k, (drop, mid) in DROP_RATES.items():
        m = toolbox.METHODS[f"saunet_{k}stg"]
        assert m.source == "saunet" and m.kwargs == {"stages": k, "drop": drop, "drop_bottleneck": mid}
    assert set(ref["params"]) == {"1", "2", "3", "5", "9", "13"}
    for k, n in ref["params"].items():  # the authors' SAUNet(K): 775,486 … 9,496,930 parameters
        model = toolbox.build(f"saunet_{k}stg")
        assert type(model) is SAUNet and model.stages == int(k) and sum(p.numel() for p in model.parameters()) == n
    assert model.bands == 28 and model.config["dim"] == 28 and model.config["blocks"] == [1, 1, 3]


# ------------------------------------------------------------------ beyond the authors' code
def small(bands=5, stages=2, seed=0, **kw):
    torch.manual_seed(seed)
    model = SAUNet(bands=bands, stages=stages, dim=4, estimator_width=8, **kw)
    for p in model.parameters():  # away from the initialisation (γ = 0 would hide the stage coupling)
        p.data.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("case", zc.GEOMETRIES)
def test_geometries_beyond_the_authors_code(case):
    zc.check_geometry(small, case)


def test_axis_h_is_the_transposed_problem_and_fractional_offsets_are_refused():
    zc.check_axis_h_and_refusals(small(), "SAUNet")


def test_checkpointing_gives_the_same_gradients_drop_path_trains_and_bf16_runs():
    op = CASSI((torch.rand(16, 16) > 0.5).float(), bands=5, backend="loop")
    x = torch.rand(2, 5, 16, 16)
    grads = []
    for ckpt in (False, True):
        model = small(stages=2, checkpointing=ckpt).train()
        (model(op, op(x)) - x).square().mean().backward()
        assert all(p.grad is not None for p in model.parameters())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    model = small(stages=1, drop=0.5, drop_bottleneck=0.5).train()
    torch.manual_seed(0)
    a, b = model(op, op(x)), model(op, op(x))
    assert not torch.equal(a, b)  # stochastic depth while training ...
    with torch.no_grad():
        assert torch.equal(model.eval()(op, op(x)), model(op, op(x)))  # ... and none in eval
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = small(stages=2).train()(op, op(x))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert re.fullmatch(r"SAUNet\(bands=5, stages=1, .* M parameters\)", repr(model))
