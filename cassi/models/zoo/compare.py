"""Run the published models' own code beside cassi's, on the same machine, in the same process: equality
references (tests/make_*_reference.py) and speed comparisons (scripts/benchmark_zoo.py).

None of that code is shipped with cassi. The MST toolbox (methods of source "mst"): the path of
``simulation/train_code`` of a checkout of caiyuanhao1998/MST (its code needs ``einops``), :func:`load_toolbox`.
The authors' repositories of DPU, SSR and SAUNet (sources "dpu", "ssr", "saunet": :data:`AUTHORS`): a checkout or
its bare git directory, :func:`load_authors`. Their ``.cuda()`` calls become no-ops in this process, so that they
run on the CPU.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch import nn

from cassi.models.zoo import toolbox

__all__ = ["AUTHORS", "authors_inputs", "authors_model", "load_authors", "load_toolbox", "reference_code",
           "toolbox_inputs", "toolbox_model"]

#: source -> (the authors' repository, the files of their model code in it)
AUTHORS = {"dpu": ("ZhangJC-2k/DPU", ("Model.py",)), "ssr": ("ZhangJC-2k/SSR", ("Model.py",)),
           "saunet": ("hustvl/SAUNet", ("model/__init__.py", "model/SAUNet.py"))}


def _no_cuda() -> None:
    torch.Tensor.cuda = lambda self, *a, **k: self
    nn.Module.cuda = lambda self, *a, **k: self


def _timm_stand_in() -> None:
    """``timm.models.layers.DropPath`` for SAUNet's import where timm is not installed (the identity in eval mode,
    per-sample drop in training, as timm's)."""
    if importlib.util.find_spec("timm") is not None:
        return

    class DropPath(nn.Module):
        def __init__(self, p=0.0):
            super().__init__()
            self.p = p

        def forward(self, x):
            if not self.training or self.p == 0:
                return x
            keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - self.p)
            return x * keep / (1 - self.p)

    layers = types.ModuleType("timm.models.layers")
    layers.DropPath = DropPath
    models = types.ModuleType("timm.models")
    models.layers = layers
    timm = types.ModuleType("timm")
    timm.models = models
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers})


def load_authors(source: str, src) -> types.ModuleType:
    """The model code of ``source`` ("dpu", "ssr": their ``Model.py``; "saunet": its ``model`` package, with
    ``model_generator``) as a module, from a checkout of the authors' repository or its bare git directory (the
    files read from HEAD); ``.cuda()`` made a no-op. FileNotFoundError naming what was expected."""
    if source not in AUTHORS:
        raise ValueError(f"unknown source {source!r}: one of {sorted(AUTHORS)}")
    repo, files = AUTHORS[source]
    src = Path(src).expanduser().resolve()
    if all((src / f).is_file() for f in files):
        root = src
    elif (src / "HEAD").is_file() and (src / "objects").is_dir():
        root = Path(tempfile.mkdtemp(prefix=f"{source}_authors_"))
        for f in files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text(subprocess.run(["git", f"--git-dir={src}", "show", f"HEAD:{f}"], check=True,
                                                 capture_output=True, text=True).stdout)
    else:
        raise FileNotFoundError(f"{src} holds no {' and '.join(files)} (a checkout of {repo} or its git directory)")
    _no_cuda()
    if source == "saunet":
        _timm_stand_in()
        pkg = root / "model"
        spec = importlib.util.spec_from_file_location("saunet_authors", pkg / "__init__.py",
                                                      submodule_search_locations=[str(pkg)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["saunet_authors"] = module
    else:
        spec = importlib.util.spec_from_file_location(f"{source}_authors_model", root / "Model.py")
        module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def authors_inputs(source: str, op, mask: torch.Tensor, y: torch.Tensor):
    """The authors' inputs for one mask (H, W) and cassi's measurement y (B, 1, H, W+Δ) of ``op``: DPU and SSR
    (their Dataset.py) (y, (mask per band (1, C, H, W), Φ_s (1, 1, H, W+Δ))); SAUNet (its simu_test.py)
    (y (B, H, W+Δ), (mask placed at each band's offset (1, C, H, W+Δ), Φ_s (1, H, W+Δ))); Φ_s = Σ_c (placed
    mask)², zeros set to 1, summed in float32 as they sum it."""
    c, (h, w) = op.bands, mask.shape
    placed = torch.zeros(1, c, h, w + op.delta, device=mask.device)
    for i, d in enumerate(int(o) for o in op.offsets):
        placed[:, i, :, d:d + w] = mask
    if source == "saunet":
        phi_s = torch.sum(placed ** 2, 1)
        phi_s[phi_s == 0] = 1
        return y[:, 0], (placed, phi_s)
    phi_s = (placed ** 2).sum(dim=1, keepdim=True)
    phi_s[phi_s == 0] = 1
    return y, (mask[None, None].expand(1, c, h, w).contiguous(), phi_s)


def authors_model(code, method: str, ours: nn.Module, width: int) -> nn.Module:
    """The authors' model of ``method`` (its code: :func:`load_authors`) holding the weights of ``ours`` (cassi's
    model of that method) mapped to their names; ``width``: the frame width DPU and SSR are built for."""
    m = toolbox.METHODS[method]
    if m.source == "saunet":
        net = code.model_generator(method)
    else:
        net = code.Net(types.SimpleNamespace(stage=m.kwargs["stages"], bands=m.bands, size=width))
    state = ours.state_dict()
    net.load_state_dict({k: state[m.rename(k)] for k in net.state_dict()}, strict=True)
    return net


def reference_code(method: str, toolbox_path=None, authors: dict | None = None, device: str = "cpu"):
    """The reference code a method of the zoo is compared with: the toolbox (:func:`load_toolbox` of
    ``toolbox_path``) for source "mst", else the authors' (:func:`load_authors` of ``authors[source]``);
    ValueError naming the setting when it is not given."""
    source = toolbox.METHODS[method].source
    if source == "mst":
        if not toolbox_path:
            raise ValueError(f"{method} is compared with the MST toolbox: give toolbox=<checkout>/simulation/train_code")
        return load_toolbox(toolbox_path, device)
    where = (authors or {}).get(source)
    if not where:
        raise ValueError(f"{method} is compared with its authors' code: give authors.{source}=<a checkout of "
                         f"{AUTHORS[source][0]}>")
    return load_authors(source, where)


def load_toolbox(train_code, device: str = "cpu") -> types.SimpleNamespace:
    """The toolbox's ``architecture`` package, ``template`` and ``utils`` modules from ``train_code``. With
    ``device="cpu"`` it makes ``Tensor.cuda`` / ``Module.cuda`` no-ops in this process (the toolbox calls them
    unconditionally); on a CUDA device they are left as they are."""
    path = Path(train_code).expanduser().resolve()
    if not (path / "architecture" / "__init__.py").is_file():
        raise FileNotFoundError(f"{path} is not the toolbox's simulation/train_code (no architecture/__init__.py)")
    if torch.device(device).type == "cpu":
        torch.Tensor.cuda = lambda self, *a, **k: self
        nn.Module.cuda = lambda self, *a, **k: self
    sys.path.insert(0, str(path))
    sys.modules.setdefault("ssim_torch", types.SimpleNamespace(ssim=None))  # utils imports it; unused here
    import architecture  # noqa: PLC0415
    import template  # noqa: PLC0415
    import utils  # noqa: PLC0415
    return types.SimpleNamespace(architecture=architecture, template=template, utils=utils, path=path)


def toolbox_model(tb, method: str, ours: nn.Module | None = None, seed: int = 0) -> tuple[nn.Module, list[str]]:
    """(the toolbox's model of ``method``, its state-dict keys), holding the weights of ``ours`` (a cassi model of
    the same method; default: one with :func:`toolbox.seeded_state` weights of ``seed``) mapped to its names."""
    built = tb.architecture.model_generator(method)
    net = built[0] if isinstance(built, tuple) else built
    if ours is None:
        ours = toolbox.build(method)
        ours.load_state_dict(toolbox.seeded_state(ours, seed))
    state = ours.state_dict()
    rename = toolbox.METHODS[method].rename or (lambda k: k)
    keys = list(net.state_dict())
    net.load_state_dict({k: state[rename(k)] for k in keys}, strict=True)
    return net, keys


def toolbox_inputs(tb, method: str, x: torch.Tensor, mask: torch.Tensor):
    """(input_meas, input_mask, template args) of ``method`` for scenes x (B, C, H, W) and one mask (H, W), built
    as the toolbox's train.py builds them (``template.set_template``, ``utils.init_meas``, ``init_mask``)."""
    args = types.SimpleNamespace(template=method, input_setting=None, input_mask=None, max_epoch=300)
    tb.template.set_template(args)
    b, c = x.shape[:2]
    mask3d = mask[None, None].expand(b, c, *mask.shape).float()
    meas = tb.utils.init_meas(x, mask3d, args.input_setting)
    if args.input_mask == "Phi":
        inp_mask = tb.utils.shift(mask3d)
    elif args.input_mask == "Phi_PhiPhiT":
        phi = tb.utils.shift(mask3d)
        phi_s = torch.sum(phi ** 2, 1)
        phi_s[phi_s == 0] = 1
        inp_mask = (phi, phi_s)
    elif args.input_mask == "Mask":
        inp_mask = mask3d
    else:
        inp_mask = None
    return meas, inp_mask, args


def _median_pair(a, b, repeats: int, sync=lambda: None) -> tuple[float, float]:
    """Median seconds of ``a()`` and ``b()`` called in turn, round after round (cassi.bench's timing: a ratio
    measured under one machine state), after one warm-up call each; ``sync`` waits for the device."""
    from cassi.bench import _medians_once

    ms = _medians_once([a, b], repeats, 1, sync)
    return ms[0] / 1e3, ms[1] / 1e3


def benchmark(tb, method: str, size: int = 256, batch: int = 1, threads: int = 1, repeats: int = 5,
              train: bool = True, device: str = "cpu", precision: str = "fp32") -> dict:
    """cassi's model of ``method`` against its reference code ``tb`` (:func:`reference_code`: the toolbox's, or the
    authors' for DPU, SSR and SAUNet), same weights, same scene and mask, one process, ``threads`` torch threads:
    parameters, forward FLOPs (torch.utils.flop_counter, batch 1), and median seconds (alternating) of a forward
    pass (no gradient; inputs ready: y for cassi, the reference's inputs for it) and of a training step
    (measurement from x — ``op(x)``, the toolbox's ``utils.init_meas`` —, forward, RMSE on the result, backward,
    Adam step). x (batch, C, size, size) on ``device``; ``precision`` "bf16": both under
    ``torch.autocast(dtype=bfloat16)``, else float32."""
    from contextlib import nullcontext

    from torch.utils.flop_counter import FlopCounterMode

    from cassi import CASSI

    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    dev = torch.device(device)
    torch.set_num_threads(threads)
    ours = toolbox.build(method)
    ours.load_state_dict(toolbox.seeded_state(ours, 0))
    m = toolbox.METHODS[method]
    c = m.bands
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, c, size, size, generator=g).to(dev)
    mask = (torch.rand(size, size, generator=g) > 0.5).float().to(dev)
    op = CASSI(mask, bands=c, step=m.step).to(dev)
    y = op(x)
    if m.source == "mst":
        net, _ = toolbox_model(tb, method, ours)

        def inputs(meas_y=None):  # the toolbox measures x itself (utils.init_meas)
            meas, inp_mask, _ = toolbox_inputs(tb, method, x, mask)
            return meas, inp_mask

        def result(o):
            return o[0] if isinstance(o, (tuple, list)) else o
        call = net
    else:
        net = authors_model(tb, method, ours, size)

        def inputs(meas_y=None):
            return authors_inputs(m.source, op, mask, y if meas_y is None else meas_y)

        def result(o):  # DPU and SSR return every stage's output: the last is the result
            return o[-1] if isinstance(o, (tuple, list)) else o

        def call(meas, inp):
            return net(meas.clone(), inp) if m.source == "saunet" else net(meas.clone(), input_mask=inp)
    ours, net = ours.to(dev), net.to(dev)
    ready = inputs()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    amp = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if precision == "bf16" else nullcontext
    row = {"method": method, "threads": threads, "size": size, "batch": batch, "device": str(dev),
           "precision": precision, "params": sum(p.numel() for p in ours.parameters()),
           "toolbox_params": sum(p.numel() for p in net.parameters())}

    def fwd_ours():
        with amp():
            return ours(op, y)

    def fwd_toolbox():
        with amp():
            return result(call(*ready))

    ours.eval(), net.eval()
    with torch.no_grad():
        counter = FlopCounterMode(display=False)
        with counter:
            ours(op, y[:1])
        row["gflops"] = counter.get_total_flops() / 1e9
        row["forward_s"], row["toolbox_forward_s"] = _median_pair(fwd_ours, fwd_toolbox, repeats, sync)
    if train:
        opt_a, opt_b = torch.optim.Adam(ours.parameters(), 1e-4), torch.optim.Adam(net.parameters(), 1e-4)
        ours.train(), net.train()

        def step_ours():
            with amp():
                loss = torch.sqrt(torch.mean((ours(op, op(x)).float() - x) ** 2))
            opt_a.zero_grad(), loss.backward(), opt_a.step()

        def step_toolbox():
            with amp():
                loss = torch.sqrt(torch.mean((result(call(*inputs(op(x)))).float() - x) ** 2))
            opt_b.zero_grad(), loss.backward(), opt_b.step()

        row["train_step_s"], row["toolbox_train_step_s"] = _median_pair(step_ours, step_toolbox,
                                                                        max(3, repeats // 2), sync)
    return row
