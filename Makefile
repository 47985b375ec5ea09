# The two commands of the README:
#   make quickstart   set up a venv and run the main job on the embedded default corpus
#   make test         set up a venv and run the test suite that CI runs
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install wordnet quickstart test test-fast clean

$(STAMP): setup.py constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: a bare `torch` requirement would pull the CUDA build.
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	# DS_BUILD_OPS=0: DeepSpeed installs without compiling CUDA ops (it JIT-builds one CPU op on first use).
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints-cpu.txt -e ".[dev,eval,deepspeed,retrieval]"
	touch $(STAMP)

# WordNet 3.0 for the METEOR metric, from Debian (no data hub needed). Best effort: where
# apt-get or root is missing it prints the command, and METEOR names the fix when it runs.
WORDNET_PKGS := wordnet-base wordnet-sense-index
wordnet:
	@if [ -f /usr/share/wordnet/index.sense ] && [ -f /usr/share/wordnet/data.noun ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends $(WORDNET_PKGS) >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends $(WORDNET_PKGS) >/dev/null 2>&1; } \
	  || echo "note: apt-get install $(WORDNET_PKGS) failed; METEOR will be unavailable"; \
	else echo "note: METEOR needs WordNet: sudo apt-get install $(WORDNET_PKGS)"; fi

install: $(STAMP) wordnet

quickstart: $(STAMP)
	$(PY) -m megatron_biglm.quickstart $(ARGS)

# Everything CI runs: the fast set, spread over TEST_WORKERS processes (pytest-xdist, whole
# files per worker), then the tests marked slow one at a time (they start 2-process jobs of
# their own and compare numbers at tight tolerances, so they get the machine to themselves).
# PYTEST_RC_FILE (set by .ci/run) receives pytest's own exit status (5 only when neither run
# collected a test): make reports every failure as 2.
TEST_WORKERS ?= 2
test: $(STAMP) wordnet
	$(PY) -m megatron_biglm.data.sample_corpus --fetch
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(ARGS); fast=$$?; \
	$(PY) -m pytest -q -p no:cacheprovider -m slow $(ARGS); slow=$$?; \
	  if [ $$fast -ne 0 ] && [ $$fast -ne 5 ]; then rc=$$fast; elif [ $$slow -ne 0 ] && [ $$slow -ne 5 ]; then rc=$$slow; \
	  elif [ $$fast -eq 5 ] && [ $$slow -eq 5 ]; then rc=5; else rc=0; fi; \
	  if [ -n "$(PYTEST_RC_FILE)" ]; then echo $$rc > "$(PYTEST_RC_FILE)"; fi; exit $$rc

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(ARGS)

clean:
	rm -rf $(VENV) runs outputs .pytest_cache
