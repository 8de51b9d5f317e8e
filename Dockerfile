# scaletrain for NVIDIA GPUs: CUDA runtime base, torch pinned to the project's version from
# the PyTorch wheel index matching CUDA_VERSION, the package with its W&B extra, a non-root
# user. Build (needs registry access to pull the base image and the PyTorch index):
#   docker build -t scaletrain:cuda .
#   docker build --build-arg CUDA_VERSION=12.6.3 --build-arg TORCH_CUDA=cu126 -t scaletrain:cuda .
# Run: docker run --gpus all --ipc=host -v /shared/runs:/runs scaletrain:cuda \
#          train --train.run_dir=/runs/my-run
# (--ipc=host: the default 64 MB /dev/shm is too small for NCCL and data workers.)
# uid 10001: Ubuntu 24.04 images already have a user 1000 ("ubuntu").
ARG CUDA_VERSION=12.8.1
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu24.04

# the PyTorch wheel index for this CUDA version: https://download.pytorch.org/whl/<TORCH_CUDA>
ARG TORCH_CUDA=cu128
ARG TORCH_VERSION=2.13.0
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# torch first, from the CUDA index (PyPI's default build may not match the base image's CUDA)
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" \
        "torch==${TORCH_VERSION}"

WORKDIR /opt/scaletrain
COPY pyproject.toml README.md ./
COPY src ./src
COPY configs ./configs
RUN pip install ".[wandb]"

RUN groupadd --gid 10001 scaletrain && useradd --create-home --uid 10001 --gid 10001 scaletrain && mkdir -p /runs && chown 10001:10001 /runs
USER 10001:10001
WORKDIR /runs
ENTRYPOINT ["scaletrain"]
CMD ["--help"]
