"""Workflows: library functions that run one job on a Hydra config (train a model, score and ship a model card,
evaluate, benchmark the models or the solvers, fit a model to a camera) and the sweep records of Hydra's jobs; the
scripts in ``scripts/`` are thin Hydra shims that call them. A job a workflow starts in a fresh process runs as a
module (``python -m cassi.workflows.train <overrides>``, ``python -m cassi.workflows.card <overrides>``), its config
read from the repository's ``conf/`` (:data:`CONF`).

Data flows io → physics → solvers/models → lightning → workflows → scripts: a workflow may import anything in
cassi (Lightning only through ``cassi.lightning``), and nothing in cassi imports ``cassi.workflows`` (``import
cassi`` does not load it).
"""
from pathlib import Path

CONF = str(Path(__file__).resolve().parents[2] / "conf")  # the repository's Hydra configs (an absolute path)
