# One command each: `make demo` runs the main job, `make test` runs the tests (pytest-xdist: one worker per core).
# Both bootstrap a local virtual environment (.venv) on first use, idempotently.
PYTHON ?= python3
VENV   ?= .venv
# CPU wheel by default (no CUDA packages). GPU users: `make TORCH=torch` or
# install their own torch into $(VENV) before running make.
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python

.PHONY: demo test bench venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,sweep]"
	touch $@

# the learned model for the demo's generated scenes, beside GAP-TV (ARGS="ckpt=null": GAP-TV alone)
demo: venv
	$(PY) scripts/reconstruct.py ckpt=pretrained/synthetic_demo $(ARGS)

test: venv
	$(PY) -m pytest -q -n auto $(ARGS)

bench: venv
	$(PY) scripts/benchmark.py $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
