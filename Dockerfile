# specroute images. Targets:
#   wheel              python:3.11-slim + gcc: the specroute wheel, hot path compiled (mypyc)
#   gateway (default)  python:3.11-slim + that wheel with [picker]  -> specroute gateway
#   embedded           + torch CPU wheel and `.[embedded]`          -> specroute worker
#   sglang-worker      SGLang's CUDA image + specroute (no deps)    -> specroute supervise
#   fleet-controller   + `.[k8s]` (the kubernetes client)           -> specroute fleet-controller
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23

# The wheel, with the hot modules of gateway/compiled.py compiled by mypyc (setup.py): the
# compiler lives in this stage only. Without one the wheel is pure Python and says so.
FROM python:3.11-slim AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY specroute specroute
COPY gateway gateway
COPY policies policies
COPY workers workers
COPY bench bench
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY --from=wheel /wheels /wheels
COPY bench bench
# xds-protos overwrites opentelemetry/proto with an older copy: restore the exporter's
RUN pip install "$(ls /wheels/specroute-*.whl)[picker]" && pip install --force-reinstall --no-deps \
    "opentelemetry-proto==$(\
    python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
RUN useradd --create-home --uid 10001 specroute
USER specroute

FROM base AS embedded
USER root
# The CPU build of torch first, so `.[embedded]` finds its pin satisfied and never pulls CUDA.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install "$(ls /wheels/specroute-*.whl)[embedded]"
USER specroute
EXPOSE 30000
ENTRYPOINT ["specroute"]
CMD ["worker", "--method", "plain", "--host", "0.0.0.0", "--port", "30000"]

# The supervisor runs inside SGLang's own image so it can exec `python -m sglang.launch_server`.
# Only what the supervisor imports is added; SGLang's pinned stack is left alone.
FROM ${SGLANG_IMAGE} AS sglang-worker
WORKDIR /opt/specroute
COPY pyproject.toml setup.py README.md ./
COPY specroute specroute
COPY gateway gateway
COPY policies policies
COPY workers workers
COPY bench bench
# the supervisor runs no request path: nothing to compile
RUN SPECROUTE_NO_COMPILE=1 pip install --no-deps . && pip install "redis>=5.0" "PyYAML>=6.0" "httpx>=0.27" \
 && useradd --create-home --uid 10001 specroute
USER specroute
EXPOSE 30000
ENTRYPOINT ["specroute"]
CMD ["supervise", "--config", "/etc/specroute/config.yaml", "--pool", "sglang-plain", "--port", "30000"]

FROM base AS fleet-controller
RUN pip install "$(ls /wheels/specroute-*.whl)[k8s]"
ENTRYPOINT ["specroute"]
CMD ["fleet-controller", "--config", "/etc/specroute/config.yaml"]

FROM base AS gateway
EXPOSE 8000
ENTRYPOINT ["specroute"]
CMD ["gateway", "--config", "/etc/specroute/config.yaml"]
