"""Run the MST toolbox's own code beside cassi's models, on the same machine, in the same process: equality
references (tests/make_zoo_reference.py) and speed comparisons (scripts/benchmark_zoo.py).

The toolbox is not shipped with cassi: give the path of ``simulation/train_code`` of a checkout of
caiyuanhao1998/MST (its code needs ``einops``). Its ``.cuda()`` calls become no-ops in this process
(:func:`load_toolbox`), so that it runs on the CPU.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
from torch import nn

from cassi.models.zoo import toolbox

__all__ = ["load_toolbox", "toolbox_model", "toolbox_inputs"]


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
    """cassi's model of ``method`` against the toolbox's, same weights, same scene and mask, one process,
    ``threads`` torch threads: parameters, forward FLOPs (torch.utils.flop_counter, batch 1), and median
    seconds (alternating) of a forward pass (no gradient; inputs ready: y for cassi, the template's inputs for
    the toolbox) and of a training step (measurement from x as each trains — ``op(x)`` / ``utils.init_meas`` —,
    forward, RMSE, backward, Adam step). x (batch, C, size, size) on ``device``; ``precision`` "bf16": both
    under ``torch.autocast(dtype=bfloat16)``, else float32."""
    from contextlib import nullcontext

    from torch.utils.flop_counter import FlopCounterMode

    from cassi import CASSI

    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
    dev = torch.device(device)
    torch.set_num_threads(threads)
    ours = toolbox.build(method)
    ours.load_state_dict(toolbox.seeded_state(ours, 0))
    net, _ = toolbox_model(tb, method, ours)
    ours, net = ours.to(dev), net.to(dev)
    c = toolbox.METHODS[method].bands
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, c, size, size, generator=g).to(dev)
    mask = (torch.rand(size, size, generator=g) > 0.5).float().to(dev)
    op = CASSI(mask, bands=c, step=toolbox.METHODS[method].step).to(dev)
    y = op(x)
    meas, inp_mask, _ = toolbox_inputs(tb, method, x, mask)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    amp = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if precision == "bf16" else nullcontext
    row = {"method": method, "threads": threads, "size": size, "batch": batch, "device": str(dev),
           "precision": precision, "params": sum(p.numel() for p in ours.parameters()),
           "toolbox_params": sum(p.numel() for p in net.parameters())}

    def first(o):
        return o[0] if isinstance(o, (tuple, list)) else o

    def fwd_ours():
        with amp():
            return ours(op, y)

    def fwd_toolbox():
        with amp():
            return first(net.eval()(meas, inp_mask))

    with torch.no_grad():
        counter = FlopCounterMode(display=False)
        with counter:
            ours.eval()(op, y[:1])
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
                m_in, m_mask, _ = toolbox_inputs(tb, method, x, mask)
                loss = torch.sqrt(torch.mean((first(net(m_in, m_mask)).float() - x) ** 2))
            opt_b.zero_grad(), loss.backward(), opt_b.step()

        row["train_step_s"], row["toolbox_train_step_s"] = _median_pair(step_ours, step_toolbox,
                                                                        max(3, repeats // 2), sync)
    return row
