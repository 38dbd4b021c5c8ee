"""Workflows: library functions that run one job on a Hydra config (score and ship a model card, benchmark the
models or the solvers); the scripts in ``scripts/`` are thin Hydra shims that call them.

Data flows io → physics → solvers/models → lightning → workflows → scripts: a workflow may import anything in
cassi, and nothing in cassi imports ``cassi.workflows`` (``import cassi`` does not load it).
"""
