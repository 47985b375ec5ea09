# The two commands of the README:
#   make quickstart   set up a venv and run the main job on the embedded default corpus
#   make test         set up a venv and run the test suite that CI runs
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install quickstart test test-fast clean

$(STAMP): setup.py constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: a bare `torch` requirement would pull the CUDA build.
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	# DS_BUILD_OPS=0: DeepSpeed installs without compiling CUDA ops (it JIT-builds one CPU op on first use).
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints-cpu.txt -e ".[dev,eval,deepspeed]"
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	$(PY) -m megatron_biglm.quickstart $(ARGS)

# Everything CI runs: the fast set plus the tests marked slow (multi-process, training).
# PYTEST_RC_FILE (set by .ci/run) receives pytest's own exit status: make reports every failure as 2.
test: $(STAMP)
	$(PY) -m megatron_biglm.data.sample_corpus --fetch
	$(PY) -m pytest -q -p no:cacheprovider $(ARGS); rc=$$?; \
	  if [ -n "$(PYTEST_RC_FILE)" ]; then echo $$rc > "$(PYTEST_RC_FILE)"; fi; exit $$rc

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(ARGS)

clean:
	rm -rf $(VENV) runs outputs .pytest_cache
