# specroute images. Targets:
#   gateway (default)  python:3.11-slim + `pip install .[picker]` -> specroute gateway
#   embedded           + torch CPU wheel and `.[embedded]`          -> specroute worker
#   sglang-worker      SGLang's CUDA image + specroute (no deps)    -> specroute supervise
#   fleet-controller   + `.[k8s]` (the kubernetes client)           -> specroute fleet-controller
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY specroute specroute
COPY gateway gateway
COPY policies policies
COPY workers workers
COPY bench bench
# xds-protos overwrites opentelemetry/proto with an older copy: restore the exporter's
RUN pip install ".[picker]" && pip install --force-reinstall --no-deps "opentelemetry-proto==$(\
    python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
RUN useradd --create-home --uid 10001 specroute
USER specroute

FROM base AS embedded
USER root
# The CPU build of torch first, so `.[embedded]` finds its pin satisfied and never pulls CUDA.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install ".[embedded]"
USER specroute
EXPOSE 30000
ENTRYPOINT ["specroute"]
CMD ["worker", "--method", "plain", "--host", "0.0.0.0", "--port", "30000"]

# The supervisor runs inside SGLang's own image so it can exec `python -m sglang.launch_server`.
# Only what the supervisor imports is added; SGLang's pinned stack is left alone.
FROM ${SGLANG_IMAGE} AS sglang-worker
WORKDIR /opt/specroute
COPY pyproject.toml README.md ./
COPY specroute specroute
COPY gateway gateway
COPY policies policies
COPY workers workers
COPY bench bench
RUN pip install --no-deps . && pip install "redis>=5.0" "PyYAML>=6.0" "httpx>=0.27" \
 && useradd --create-home --uid 10001 specroute
USER specroute
EXPOSE 30000
ENTRYPOINT ["specroute"]
CMD ["supervise", "--config", "/etc/specroute/config.yaml", "--pool", "sglang-plain", "--port", "30000"]

FROM base AS fleet-controller
RUN pip install ".[k8s]"
ENTRYPOINT ["specroute"]
CMD ["fleet-controller", "--config", "/etc/specroute/config.yaml"]

FROM base AS gateway
EXPOSE 8000
ENTRYPOINT ["specroute"]
CMD ["gateway", "--config", "/etc/specroute/config.yaml"]
