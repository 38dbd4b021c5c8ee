"""The field's models (the MST toolbox's architectures, and DPU, SSR and SAUNet from their authors' code) in cassi:
each called as ``model(op, y) -> x`` (B, C, H, W), deriving its authors' inputs from the operator; the published trained
weights convert with ``python scripts/convert_checkpoint.py source=mst method=<name> weights=<.pth> out=<.ckpt>``
(``source=dpu`` for ``dpu_5stg``/``dpu_9stg``, ``source=ssr`` for ``ssr_s``/``ssr_m``/``ssr_l``,
``source=saunet`` for ``saunet_1stg`` … ``saunet_13stg``;
:func:`cassi.models.zoo.toolbox.convert`). Imports torch only."""
from cassi.models.zoo import dauhst, dpu, gapnet, hdnet, mst, saunet, ssr  # noqa: F401  (each registers its classes and methods)
from cassi.models.zoo.toolbox import METHODS, ToolboxModel, build, convert, load_toolbox_weights

__all__ = ["METHODS", "ToolboxModel", "build", "convert", "load_toolbox_weights"]
