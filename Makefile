# Attention Lab. `make book` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
VENV_STAMP := $(VENV)/.installed
KERNELS_STAMP := $(VENV)/.kernels
SWEEP_STAMP := $(VENV)/.sweep
VENDOR := book/_static/vendor
VENDOR_STAMP := $(VENDOR)/.installed
PORT ?= 8000
# One torch thread per worker when tests run two workers on two cores.
ONE_THREAD := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYDEVD_DISABLE_FILE_VALIDATION := 1

NOTEBOOKS ?= $(sort $(wildcard notebooks/*.ipynb))

.PHONY: help setup kernels sweep book test test-lib nbval test-wheel test-browser serve lab clean lock strip record chromium

help:
	@echo "make book   build the static site into _build/html (sets everything up first)"
	@echo "make test   library, quiz, notebook, wheel, book and browser tests"
	@echo "make serve  serve the built site on http://127.0.0.1:$(PORT)"
	@echo "make lab    open the chapters in JupyterLab"
	@echo "make clean  remove the environment, assets and build"

setup: $(VENV_STAMP) $(VENDOR_STAMP)

$(VENV_STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

# Triton for chapter 07's kernel exercise (about 700 MB installed); make test needs it.
kernels: $(KERNELS_STAMP)

$(KERNELS_STAMP): $(VENV_STAMP) requirements-kernels.txt
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-kernels.txt
	touch $@

# Ray for the recall grid's --backend ray and its test (about 260 MB installed); make test needs it.
sweep: $(SWEEP_STAMP)

$(SWEEP_STAMP): $(VENV_STAMP) requirements-test.txt
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-test.txt
	touch $@

# Browser assets (MathJax 3, the Jupyter widget manager) come from pinned npm packages and are
# copied into the site's static folder; they are never committed.
$(VENDOR_STAMP): package.json package-lock.json scripts/vendor_assets.sh
	npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	bash scripts/vendor_assets.sh node_modules $(VENDOR)
	touch $@

# Every chapter is executed once, two kernels at a time with one thread each, on copies in empty
# folders (what a Colab reader gets); the executed copies are staged with the book's other sources
# in _build/source, and Sphinx builds the site from there without executing anything again.
# CHECK=--check (make test) fails when a cell tagged nbval-check-output prints something other
# than its stored output.
book: setup
	rm -rf _build
	$(ONE_THREAD) $(PY) scripts/execute_notebooks.py --jobs 2 --out _build/source $(CHECK) $(NOTEBOOKS)
	$(BIN)/jupyter-book build _build/source --path-output . -W -n --keep-going
	@echo
	@echo "Built. Open _build/html/index.html in a browser, or run 'make serve' and visit http://127.0.0.1:$(PORT)"

# ATTNLAB_REQUIRE_TRITON=1 turns the Triton sections' skip (Triton missing) into a failure, so
# the kernel exercise and its tests really run here; ATTNLAB_REQUIRE_RAY=1 does the same for Ray.
test: setup kernels sweep chromium
	ATTNLAB_REQUIRE_TRITON=1 ATTNLAB_REQUIRE_RAY=1 $(MAKE) test-lib
	$(MAKE) test-wheel
	ATTNLAB_REQUIRE_TRITON=1 $(MAKE) book CHECK=--check
	$(MAKE) test-browser

test-lib:
	$(ONE_THREAD) $(PY) -m pytest tests -m "not browser" -q -n 2

# The notebooks as a reader checks them, with nbval (make test does the same check once, while
# building the book): copies in an empty folder away from the repository, so nothing may be
# read by a repository-relative path (what a Colab reader gets). Not part of `make test`.
nbval: setup
	d=$$(mktemp -d) && cp notebooks/*.ipynb "$$d"/ && cd "$$d" && \
	  $(ONE_THREAD) $(CURDIR)/$(PY) -m pytest -p no:cacheprovider --rootdir "$$d" --nbval-lax -n 2 --dist loadfile \
	    --nbval-sanitize-with $(CURDIR)/tests/nbval_sanitize.cfg *.ipynb; \
	  rc=$$?; rm -rf "$$d"; exit $$rc

test-wheel:
	d=$$(mktemp -d) && $(BIN)/pip wheel -q --no-deps --no-build-isolation -w "$$d" . && \
	  $(PY) scripts/check_wheel.py "$$d"/attnlab-*.whl; rc=$$?; rm -rf "$$d" build; exit $$rc

test-browser:
	$(PY) -m pytest tests/test_site_browser.py -m browser -q -p no:xdist

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing Debian's chromium for the browser test"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "The browser test needs Chromium at /usr/bin/chromium. Install it with:"; \
	    echo "    sudo apt-get install chromium"; \
	    exit 1; \
	  fi; }

serve: book
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

lab: setup
	$(BIN)/jupyter lab --ip=127.0.0.1 notebooks/

# Strip outputs, keeping those of cells tagged nbval-check-output (what nbval compares).
strip:
	$(PY) scripts/strip_outputs.py notebooks/*.ipynb

# Re-execute the chapters (NOTEBOOKS=notebooks/NN_name.ipynb for one) with the thread settings
# `make test` uses, and store the outputs of the checked cells; run after editing a chapter.
record: setup
	$(ONE_THREAD) $(PY) scripts/execute_notebooks.py --jobs 2 --record $(NOTEBOOKS)
	$(PY) scripts/strip_outputs.py $(NOTEBOOKS)

lock: $(VENV_STAMP)
	$(BIN)/pip install -q -r requirements.in
	{ head -2 requirements.txt; $(BIN)/pip freeze --all --exclude-editable | grep -vE '^(attnlab|pip)==' \
	  | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; echo "-e ."; } > requirements.lock && mv requirements.lock requirements.txt

clean:
	rm -rf $(VENV) node_modules $(VENDOR) _build src/*.egg-info
