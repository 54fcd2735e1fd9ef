# A Prefect process worker that runs agent-r1's flows: the project and its dependencies.
# Build context: the repository root (see infra/docker-compose.yml). The default torch is the
# CPU build; for a GPU worker pass --build-arg TORCH_INDEX_URL=<the PyTorch CUDA index for
# your driver> (and see infra/README.md: the learner does not place tensors on GPUs yet).
FROM python:3.11-slim

# g++: DeepSpeed compiles a small op at first start; git: DVC and Prefect's git pull steps.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ git \
    && rm -rf /var/lib/apt/lists/*

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -e . "dvc[s3]"

ENV PREFECT_SERVER_ANALYTICS_ENABLED=false \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=1 \
    DVC_NO_ANALYTICS=1 \
    OMP_NUM_THREADS=1 \
    TORCH_EXTENSIONS_DIR=/app/.cache/torch_extensions
CMD ["prefect", "worker", "start", "--pool", "agent-r1", "--type", "process"]
