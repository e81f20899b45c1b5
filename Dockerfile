# tandem in a container: the release binary and the bundled SmolLM2 model. Every role runs this
# image (`serve --role api|trainer`); configuration comes from TANDEM_* variables
# (README's table). See docs/deploy.md and deploy/compose.yaml.
#
# For users with a registry and Docker. It follows the steps of scripts/build-image.sh (`make
# image`), which the project's machines build and test (`make test-image`) from Debian's packages
# alone: the same binary, model, user (uid 10001, home /data), settings, volume and port. This file
# itself is not built there (they reach no container registry).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bin tandem

FROM python:3.11-slim-bookworm AS model
COPY scripts/fetch-model.sh /fetch-model.sh
RUN bash /fetch-model.sh /models/SmolLM2-135M-Instruct.Q4_1.gguf

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 tandem \
    && useradd --uid 10001 --gid 10001 --home-dir /data --create-home --shell /usr/sbin/nologin tandem
COPY --from=build /src/target/release/tandem /usr/local/bin/tandem
COPY --from=model /models /models
# Numeric, so that runtimes can tell it is not root without reading /etc/passwd (runAsNonRoot).
USER 10001:10001
ENV TANDEM_HOST=0.0.0.0 \
    TANDEM_PORT=8000 \
    TANDEM_DATA_DIR=/data \
    TANDEM_MODEL=/models/SmolLM2-135M-Instruct.Q4_1.gguf
VOLUME /data
EXPOSE 8000
# 503 while the store is down, the engine is stuck, or an operator drains the node.
HEALTHCHECK --interval=10s --timeout=3s CMD ["curl", "-fsS", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["tandem"]
CMD ["serve"]
