"""cassi: coded aperture snapshot spectral imaging.

Importing this package pulls in torch only (no Lightning, no Hydra).
"""
from cassi.operator import CASSI

__all__ = ["CASSI"]
__version__ = "0.1.0"
