# One command each: `make demo` runs the main job, `make test` runs the tests (pytest-xdist: one worker per core),
# `make docs` builds the documentation site into site/ (mkdocs, strict: a broken link or reference fails).
# All bootstrap a local virtual environment (.venv) on first use, idempotently.
PYTHON ?= python3
VENV   ?= .venv
# CPU wheel by default (no CUDA packages). GPU users: `make TORCH=torch` or
# install their own torch into $(VENV) before running make.
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python

.PHONY: demo test bench docs venv clean content

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,sweep]"
	touch $@

# the demo: a spectral test chart (measured ColorChecker reflectances under D65, docs/demo.md) reconstructed by
# its learned model beside GAP-TV (ARGS go to this run; ARGS="ckpt=null": GAP-TV alone), into $(DEMO_OUT); with
# the real TSA measurements at hand (REAL: a folder holding real/ and masks/), also one real scene, tsa_real
# beside gap_tv_real, into $(DEMO_OUT)/real
REAL       ?= ../shared/data
DEMO_STAMP := $(shell date +%Y-%m-%d_%H-%M-%S)
DEMO_OUT   ?= outputs/demo/$(DEMO_STAMP)
demo: venv
	@echo "demo: a spectral test chart, chart_demo beside GAP-TV, into"; echo "  $(DEMO_OUT)"
	@$(PY) scripts/reconstruct.py data=chart ckpt=pretrained/chart_demo output_dir=$(DEMO_OUT) $(ARGS)
	@if [ -f "$(REAL)/real/tsa_real_scene1.mat" ] && [ -f "$(REAL)/masks/tsa_real_mask_660.mat" ]; then \
	  echo "real scene: tsa_real beside gap_tv_real on"; echo "  $(REAL)/real/tsa_real_scene1.mat, into"; \
	  echo "  $(DEMO_OUT)/real"; \
	  $(PY) scripts/reconstruct.py data=real ckpt=pretrained/tsa_real solver=gap_tv_real output_dir=$(DEMO_OUT)/real \
	    data.predict.entries="$(REAL)/real/tsa_real_scene1.mat" data.predict.mask="$(REAL)/masks/tsa_real_mask_660.mat"; \
	else echo "real scene skipped: no TSA real data in $(REAL) (real/tsa_real_scene1.mat, masks/tsa_real_mask_660.mat); add them with: make demo REAL=<folder>"; fi
	@if [ -f "$(DEMO_OUT)/real/index.html" ]; then echo "demo reports:"; echo "  $(DEMO_OUT)/index.html"; \
	  echo "  $(DEMO_OUT)/real/index.html (the real scene)"; \
	else echo "demo report:"; echo "  $(DEMO_OUT)/index.html"; fi

test: venv
	$(PY) -m pytest -q -n auto $(ARGS)

# training content beyond CAVE (measured spectra, photographs) from PyPI and Debian into data/content, once
# (docs/datasets.md#content-beyond-cave-python-scriptsfetch_contentpy); ARGS: e.g. "sources=[earthlib,skimage]"
content: venv
	$(PY) scripts/fetch_content.py $(ARGS)

bench: venv
	$(PY) scripts/benchmark.py $(ARGS)

# the docs extra (mkdocs-material, mkdocstrings, markdown-exec) on top of the venv, once
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

# offline and strict: no fonts or scripts fetched at build time; the examples in the pages run on the CPU
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache site
