"""The field's models (the MST toolbox's architectures, and DPU from its authors' code) in cassi: each called as
``model(op, y) -> x`` (B, C, H, W), deriving its authors' inputs from the operator; the published trained weights
convert with ``python scripts/convert_checkpoint.py source=mst method=<name> weights=<.pth> out=<.ckpt>``
(``source=dpu`` for ``dpu_5stg``/``dpu_9stg``; :func:`cassi.models.zoo.toolbox.convert`). Imports torch only."""
from cassi.models.zoo import dauhst, dpu, gapnet, hdnet, mst  # noqa: F401  (each registers its classes and methods)
from cassi.models.zoo.toolbox import METHODS, ToolboxModel, build, convert, load_toolbox_weights

__all__ = ["METHODS", "ToolboxModel", "build", "convert", "load_toolbox_weights"]
