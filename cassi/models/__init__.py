"""Learned reconstruction: unrolled networks (GAP-Net, ADMM-Net, DAUHST (cassi.models.zoo)), their prior blocks,
training losses and checkpoint loading. Imports torch (and torchmetrics) only.

    from cassi.models import GAPNet, load_model
    model = GAPNet(bands=28, stages=5)          # model(op, y) -> (B, C, H, W), like a solver
    model = Refiner(bands=28)                   # GAP-TV, then a learned correction
    model = load_model("runs/best.ckpt")        # from a training checkpoint, geometry checked
"""
from cassi.models.blocks import ResStack, UNet
from cassi.models.checkpoint import architecture, export_weights, load_model, load_prior, resolve_checkpoint
from cassi.models.losses import ReconstructionLoss
from cassi.models.refine import Refiner
from cassi.models.unrolled import ADMMNet, GAPNet, Reconstructor, Unrolled

__all__ = ["ADMMNet", "DAUHST", "GAPNet", "HalfShuffleTransformer", "ReconstructionLoss", "Reconstructor", "Refiner", "ResStack", "StageEstimator",
           "UNet", "Unrolled", "architecture", "export_weights", "load_model", "load_prior", "resolve_checkpoint"]

from cassi.models import zoo  # noqa: E402,F401  (registers the toolbox's architectures)
from cassi.models.zoo.dauhst import DAUHST, HalfShuffleTransformer, StageEstimator  # noqa: E402
