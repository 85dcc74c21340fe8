# Space image: the server on port 8000 as uid 1000, bubblewrap for the local sandbox, Pi baked in.
# Not built in this project's CI (no Docker engine there); the same steps run in scripts/setup.sh, which CI does run.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap ripgrep fd-find git patch curl ca-certificates xz-utils \
 && rm -rf /var/lib/apt/lists/*

# Node.js >= 20.6 for the agent CLIs (Debian bookworm ships 18), copied from the official Node image.
COPY --from=node:20-bookworm-slim /usr/local/bin/node /usr/local/bin/node
COPY --from=node:20-bookworm-slim /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm

RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/app/.venv/bin:$PATH SWE_GYM_ENV_HOME=/home/user/.cache/swe_gym_env \
    UV_PYTHON_DOWNLOADS=never HF_HUB_OFFLINE=1
WORKDIR /home/user/app

COPY --chown=user pyproject.toml uv.lock README.md ./
RUN pip install --user -q uv==0.13.9 && python -m uv sync --frozen --no-dev --extra server --extra model --no-install-project
COPY --chown=user . .
RUN python -m uv sync --frozen --no-dev --extra server --extra model && .venv/bin/swe-gym-env setup

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD curl -fsS http://127.0.0.1:8000/health || exit 1
CMD ["uvicorn", "swe_gym_env.server.asgi:app", "--host", "0.0.0.0", "--port", "8000"]
