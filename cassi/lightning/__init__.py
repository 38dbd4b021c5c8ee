"""Lightning modules, data modules and callbacks: the only part of cassi that imports Lightning (its
``seed_everything`` re-exported for the workflows above)."""
import logging as _logging
import warnings as _warnings

from lightning.pytorch import seed_everything

from cassi.lightning.datamodule import CASSIDataModule
from cassi.lightning.module import ReconstructionModule
from cassi.lightning.training import TrainingModule, warmup_cosine

__all__ = ["CASSIDataModule", "ReconstructionModule", "TrainingModule", "seed_everything", "warmup_cosine"]


class _NoTips(_logging.Filter):
    """Drops Lightning's advertising tips ("💡 Tip: ... try installing litlogger / litmodels ..."): a 200-character
    line in the output of every run, which says nothing about the run."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    _logging.getLogger(_name).addFilter(_NoTips())

# Lightning's own use of torch's pytree API (lightning/pytorch/utilities/_pytree.py), deprecated in torch 2.13: a
# 200-character warning in every run that the user cannot act on
_warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
