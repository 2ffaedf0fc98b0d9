# encoderpool: every target installs what it needs. Heavy things (torch, the Go-built control
# plane, helm, tiny checkpoints) live in a cache OUTSIDE the repo, so warm runs are fast.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CACHE      ?= $(HOME)/.cache/encoderpool
TOOLS      := $(CACHE)/tools
UV         := $(TOOLS)/bin/uv
UV_VERSION := 0.13.8
VENV       := .venv
PY         := $(VENV)/bin/python
export UV_CACHE_DIR ?= $(CACHE)/uv
export ENCODERPOOL_CACHE := $(CACHE)
MODEL_ARCH ?= qwen2_vl
MODEL      ?= $(CACHE)/models/$(MODEL_ARCH)-tiny
HOST       ?= 127.0.0.1
PORT       ?= 30000
PYTEST_ARGS ?=

.PHONY: help venv lock generate model run test test-unit test-integration e2e cluster control-plane bench lint images kind-e2e clean

help:
	@echo "make run    - install, build the tiny default checkpoint, serve it on $(HOST):$(PORT)"
	@echo "make test   - install, build what the tests need, run the whole suite"
	@echo "make test-unit - only the unit tier"
	@echo "make test-integration - only the integration tier (server subprocesses, tiny checkpoints)"
	@echo "make e2e    - only the control-plane end-to-end tier"
	@echo "make lint   - import contracts, mypy and vulture on encoder_pod/ and operator/ (also run by make test)"
	@echo "make control-plane - build the local Kubernetes control plane into the cache"
	@echo "make cluster - start a local control plane with fake GPU nodes (Ctrl-C stops it)"
	@echo "make bench  - run the benchmarks, write bench/results/"
	@echo "make bench-peers - the peer benchmark (infinity-emb, Ray Serve), not part of make bench"
	@echo "make images - build the operator and CPU encoder images (starts a Docker engine if none runs)"
	@echo "make kind-e2e - build the images and kind, run tests/kind on a kind cluster, leave the host as found"
	@echo "make lock   - after changing a dependency in pyproject.toml: re-pin uv.lock and constraints.txt"
	@echo "make generate - after changing a setting in encoder_pod/settings.py: rewrite the CRD, the operator's podsettings.py and docs/configuration.md's table"

$(UV):
	@echo ">> installing uv $(UV_VERSION) into $(TOOLS)"
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q uv==$(UV_VERSION)

# Every dependency is pinned by uv.lock: `uv sync --locked` installs exactly the locked versions
# (and removes anything else), and refuses to run when pyproject.toml changed without `make lock`.
export UV_PROJECT_ENVIRONMENT := $(VENV)
$(VENV)/.installed: pyproject.toml uv.lock | $(UV)
	@echo ">> syncing $(VENV) with uv.lock (torch is cached in $(UV_CACHE_DIR) after the first run)"
	$(UV) sync --locked --python python3.11 --extra dev --extra mooncake --extra grpc
	@touch $@

# uv.lock pins make and CI; constraints.txt is the same pins for pip (the images: pip install -c).
lock: | $(UV)
	$(UV) lock
	$(UV) export --frozen --all-extras --no-emit-project --no-hashes --format requirements-txt -o constraints.txt

venv: $(VENV)/.installed

model: venv
	@test -f $(MODEL)/config.json || $(VENV)/bin/encoder-pod make-tiny-model --arch $(MODEL_ARCH) --out $(MODEL)

DEMO_PNG := iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKklEQVR42u3NMQEAAAQAMATRP4pYSvBtBZbTHZ8qngkEAoFAIBAIBIIrC+AFAUQz669uAAAAAElFTkSuQmCC

run: model
	@echo ">> serving $(MODEL) on http://$(HOST):$(PORT) (Ctrl-C stops). Once 'encoder ready' shows, in another shell:"
	@echo "   curl -s http://$(HOST):$(PORT)/encode -H 'content-type: application/json' -d '{\"req_id\":\"demo-1\",\"modality\":\"IMAGE\",\"mm_items\":[\"data:image/png;base64,$(DEMO_PNG)\"]}' | head -c 300; echo"
	@echo "   curl -s http://$(HOST):$(PORT)/metrics | grep -E '^encoder_(batch_size|requests)'"
	$(VENV)/bin/encoder-pod serve --model-path $(MODEL) --host $(HOST) --port $(PORT)

control-plane:
	@bash hack/build-control-plane.sh

test: lint control-plane
	bash hack/system-libs.sh
	bash hack/prometheus.sh
	bash hack/run-tests.sh $(PYTEST_ARGS)

test-unit: venv
	$(VENV)/bin/pytest -m unit $(PYTEST_ARGS)

test-integration: venv
	bash hack/system-libs.sh
	bash hack/prometheus.sh
	$(VENV)/bin/pytest -m integration $(PYTEST_ARGS)

e2e: venv control-plane
	bash hack/prometheus.sh
	$(VENV)/bin/pytest -m e2e $(PYTEST_ARGS)

cluster: venv control-plane
	$(PY) -m testkit.cluster

bench: model
	$(PY) bench/run_all.py

# Not part of `make bench`: installs infinity-emb and Ray Serve into $(CACHE)/peers/ (torch from
# the uv cache, no torchvision) and takes about 17 minutes on 2 cores. DEVICE=cuda on a GPU host.
.PHONY: bench-peers
bench-peers: venv
	$(PY) -m bench.peer_bench --device $(or $(DEVICE),cpu)

# The parts of the CRD, the operator and the docs derived from the pod's settings declaration.
generate: venv
	$(PY) -m encoder_pod.settings_gen

lint: venv
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy encoder_pod operator
	$(VENV)/bin/vulture
	$(PY) -m encoder_pod.settings_gen --check

# ENCODER_VARIANTS="cpu cuda" builds the CUDA variant too.
images: | $(UV)
	bash hack/images.sh

kind-e2e: venv
	bash hack/kind-e2e.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
