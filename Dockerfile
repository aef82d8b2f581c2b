# syntax=docker/dockerfile:1
# fp4forge in a container: built with the `cuda` feature in a Rust image, shipped on a slim
# Ubuntu runtime holding NVRTC (the CUDA driver comes from the host through the NVIDIA
# Container Toolkit). Recipes: docs/deploy.md.
#
#   docker build -t fp4forge .                                      # CUDA (default target)
#   docker build -t fp4forge:cpu --target cpu --build-arg FEATURES= .   # CPU only
#
# The entry point is `fp4forge`; the HEALTHCHECK probes GET /health on port 8000, so serve with
# `--host 0.0.0.0` (and override the check, `--health-cmd`, if you change `--port`).

ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG CPU_BASE=debian:bookworm-slim
ARG CUDA_BASE=ubuntu:24.04

# --- build: the release binary and the third-party notices of what it links ------------------
FROM ${RUST_IMAGE} AS build
# Cargo features of the binary: `cuda` (default) or empty for a CPU-only build.
ARG FEATURES=cuda
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p fp4forge ${FEATURES:+--features "$FEATURES"} \
    && strip -o /usr/local/bin/fp4forge target/release/fp4forge \
    && python3 scripts/third-party-notices.py /THIRD-PARTY-NOTICES

# --- nvrtc: NVIDIA's runtime compiler, the pinned and sha256-checked PyPI wheel CI compiles the
# kernels with (scripts/fetch-nvrtc.sh) --------------------------------------------------------
FROM ${PYTHON_IMAGE} AS nvrtc
WORKDIR /src
COPY scripts/fetch-nvrtc.sh scripts/
RUN scripts/fetch-nvrtc.sh

# --- cpu: the CPU-only image (`--target cpu --build-arg FEATURES=`) ----------------------------
FROM ${CPU_BASE} AS cpu
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 fp4forge \
    && useradd --system --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin fp4forge
COPY --from=build /usr/local/bin/fp4forge /usr/local/bin/fp4forge
COPY --from=build /THIRD-PARTY-NOTICES /src/LICENSE /usr/share/doc/fp4forge/
# Not root: uid/gid 10001 (fp4forge); models are mounted read-only.
USER 10001:10001
WORKDIR /home/fp4forge
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["fp4forge"]
CMD ["--help"]

# --- cuda: the default image ---------------------------------------------------------------------
FROM ${CUDA_BASE} AS cuda
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 fp4forge \
    && useradd --system --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin fp4forge \
    && install -d -o 10001 -g 10001 /home/fp4forge/.cache /home/fp4forge/.cache/fp4forge
COPY --from=nvrtc /src/target/nvrtc/nvidia/cu13/lib/ /opt/nvrtc/lib/
COPY --from=build /usr/local/bin/fp4forge /usr/local/bin/fp4forge
COPY --from=build /THIRD-PARTY-NOTICES /src/LICENSE /usr/share/doc/fp4forge/
# The engine compiles its kernels with this NVRTC (13.5) at its first start on a GPU (cached in
# ~/.cache/fp4forge/kernels: mount a volume there to keep them), so the host driver must support
# CUDA 13.5 or later; the toolkit checks NVIDIA_REQUIRE_CUDA before starting.
ENV LD_LIBRARY_PATH=/opt/nvrtc/lib \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.5"
# Not root: uid/gid 10001 (fp4forge); models are mounted read-only.
USER 10001:10001
WORKDIR /home/fp4forge
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10m --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["fp4forge"]
CMD ["--help"]
