# Two commands for a fresh machine that has only Python:
#   make demo   the main job: the zoo reproduction report (reports/zoo/report.html)
#   make test   the test suite (slow, gpu and network markers are skipped)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: demo test test-slow bench install clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The CPU torch wheel first, pinned: an unpinned torch pulls a multi-GB CUDA build. A torch that is
# already importable in the venv (a GPU user's own build) is kept.
$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[reference,test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lmforge reproduce zoo --out reports --overwrite

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) benchmarks/engines.py

clean-venv:
	rm -rf $(VENV)
