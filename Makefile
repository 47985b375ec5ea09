# The two commands of the README:
#   make quickstart   set up a venv and run the main job on the embedded default corpus
#   make test         set up a venv and run the test suite that CI runs
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install wordnet quickstart test test-one test-fast clean

$(STAMP): setup.py constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: a bare `torch` requirement would pull the CUDA build.
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	# DS_BUILD_OPS=0: DeepSpeed installs without compiling CUDA ops (it JIT-builds one CPU op on first use).
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints-cpu.txt -e ".[dev,eval,deepspeed,retrieval,serve]"
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
	$(PY) -m megatron_biglm.cli.quickstart $(ARGS)

# The test suite, on one interpreter (PYTHON, installed into VENV): the fast set spread over
# TEST_WORKERS processes (pytest-xdist, whole files per worker), then the tests marked slow one
# at a time (they start 2-process jobs of their own and compare numbers at tight tolerances, so
# they get the machine to themselves). `wheels` (Python 3.12): downloads the prepared device run's
# pinned wheels into .whl/ and installs them offline (the tests named offline_wheels, ~1.5 min).
# TEST_SETS picks the sets. PYTEST_RC_FILE, when set,
# receives pytest's own exit status (5 only when no set collected a test): make reports every
# failure as 2.
TEST_WORKERS ?= 2
TEST_SETS ?= fast slow
test-one: $(STAMP) wordnet
	$(PY) -m megatron_biglm.cli.fetch_data corpus
	@fail=0; ran=0; for set in $(TEST_SETS); do \
	  case $$set in \
	    fast) $(PY) -m pytest -q -p no:cacheprovider -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(ARGS); r=$$?;; \
	    slow) $(PY) -m pytest -q -p no:cacheprovider -m slow $(ARGS); r=$$?;; \
	    wheels) $(PY) benchmarks/device_wheels.py download >/dev/null \
	      && $(PY) -m pytest -q -p no:cacheprovider -m slow -k offline_wheels $(ARGS); r=$$?;; \
	    *) echo "unknown test set '$$set' (fast, slow, wheels)"; r=2;; \
	  esac; \
	  if [ $$r -eq 0 ]; then ran=1; elif [ $$r -ne 5 ] && [ $$fail -eq 0 ]; then fail=$$r; fi; \
	done; \
	if [ $$fail -ne 0 ]; then rc=$$fail; elif [ $$ran -eq 1 ]; then rc=0; else rc=5; fi; \
	  if [ -n "$(PYTEST_RC_FILE)" ]; then echo $$rc > "$(PYTEST_RC_FILE)"; fi; exit $$rc

# Everything CI runs: the two supported stacks, each in its own venv.
#   (a) Python 3.11 and the megatron-core pip resolves there (0.16.x): fast and slow sets;
#   (b) Python 3.12 and the newest megatron-core (0.19.x; torch 2.13.0's CUDA build, which runs
#       on CPU): STACK_B_SETS, the fast set and the device wheels' offline install by default.
#       Both slow sets take ~21 min each on 2 cores, which would put CI at ~60 min;
#       STACK_B_SETS="fast slow" runs the full matrix.
# .ci/find-python locates each interpreter (PATH, pyenv, /usr/bin) or says how to install it.
# The slow set holds the tests marked slurm: they start a SLURM cluster on this host
# (tests/slurm/cluster.sh; as root it apt-get installs slurm-wlm and munge where missing) and skip
# where it cannot start; REQUIRE_SLURM=1 (CI) makes that a failure on stack (a).
STACK_B_SETS ?= fast wheels
REQUIRE_SLURM ?=
test:
	BIGLM_REQUIRE_SLURM="$(REQUIRE_SLURM)" \
	$(MAKE) --no-print-directory test-one PYTHON="$$(.ci/find-python 3.11)" VENV=.venv \
	  PYTEST_RC_FILE="$(if $(PYTEST_RC_FILE),$(PYTEST_RC_FILE).a)"; a=$$?; \
	$(MAKE) --no-print-directory test-one PYTHON="$$(.ci/find-python 3.12)" VENV=.venv-py312 \
	  TEST_SETS="$(STACK_B_SETS)" PYTEST_RC_FILE="$(if $(PYTEST_RC_FILE),$(PYTEST_RC_FILE).b)"; b=$$?; \
	echo "stacks: (a) Python 3.11 exit $$a, (b) Python 3.12 exit $$b"; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(ARGS)

clean:
	rm -rf .venv .venv-py312 runs outputs .pytest_cache
