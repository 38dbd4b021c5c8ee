"""Files choose classes only among registered ones (cassi.registry): nothing outside cassi is imported."""
import sys
import textwrap

import pytest
import torch
from torch import nn

import cassi
from cassi.models import load_model
from cassi.models.checkpoint import resolve_checkpoint
from cassi.registry import register, registered, resolve
from cassi.solvers import GAPTV, Solver


@pytest.fixture
def probe_module(tmp_path, monkeypatch):
    """An importable module outside cassi that leaves a file behind when it is imported."""
    name = "cassi_registry_probe_mod"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import pathlib, torch
        pathlib.Path({str(marker)!r}).write_text("imported")
        class Evil(torch.nn.Module):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    yield name, marker
    sys.modules.pop(name, None)


def _doctored(tmp_path, edit, name="doctored.ckpt"):
    ckpt = torch.load(resolve_checkpoint("pretrained/synthetic_demo"), map_location="cpu", weights_only=True)
    edit(ckpt["cassi"]["model"])
    path = tmp_path / name
    torch.save(ckpt, path)
    return path


def test_checkpoint_naming_a_foreign_module_is_refused_without_importing_it(tmp_path, probe_module):
    name, marker = probe_module
    path = _doctored(tmp_path, lambda m: m.update(_target_=f"{name}.Evil"))
    with pytest.raises(ValueError) as e:
        load_model(path)
    msg = str(e.value)
    assert str(path) in msg and f"'{name}.Evil' is not a registered cassi class" in msg and "\n" not in msg
    assert name not in sys.modules and not marker.exists()


def test_refiner_checkpoint_naming_a_foreign_solver_is_refused_without_importing_it(tmp_path, probe_module):
    name, marker = probe_module
    path = _doctored(tmp_path, lambda m: m["solver"].update(_target_=f"{name}.Evil"))
    with pytest.raises(ValueError, match=f"solver class '{name}.Evil' is not a registered"):
        load_model(path)
    assert name not in sys.modules and not marker.exists()


def test_stdlib_module_named_by_a_checkpoint_is_not_imported(tmp_path):
    had = "this" in sys.modules
    path = _doctored(tmp_path, lambda m: m.update(_target_="this.Nothing"))
    with pytest.raises(ValueError, match="not a registered"):
        load_model(path)
    assert ("this" in sys.modules) == had


def test_a_registered_name_of_the_wrong_kind_is_refused(tmp_path):
    path = _doctored(tmp_path, lambda m: m.update(_target_="GAPTV"))
    with pytest.raises(ValueError, match=r"'GAPTV' is cassi.solvers.pnp.GAPTV, not a Module"):
        load_model(path)
    bad_spec = _doctored(tmp_path, lambda m: m.update(bogus_argument=1), "args.ckpt")
    with pytest.raises(ValueError, match="args.ckpt.*bogus_argument"):
        load_model(bad_spec)


def test_names_resolve_by_short_defining_and_package_path():
    for name in ("GAPTV", "cassi.solvers.GAPTV", "cassi.solvers.pnp.GAPTV"):
        assert resolve(name, Solver) is GAPTV
    assert {"GAPNet", "ADMMNet", "Refiner", "GAPTV", "TwIST"} <= set(registered())
    assert "GAPTV" not in registered(nn.Module)


def test_user_class_registered_in_code_loads_from_a_file(tmp_path):
    from cassi.models.refine import Refiner

    class MyRefiner(Refiner):  # not registered yet: a checkpoint naming it is refused
        pass

    target = f"{MyRefiner.__module__}.{MyRefiner.__qualname__}"
    path = _doctored(tmp_path, lambda m: m.update(_target_=target))
    with pytest.raises(ValueError, match="register your own with cassi.register"):
        load_model(path)
    assert cassi.register(MyRefiner) is MyRefiner
    assert type(load_model(path)) is MyRefiner
    with pytest.raises(ValueError, match="has that name"):  # another class under a taken name
        register(type("GAPTV", (Solver,), {}))

