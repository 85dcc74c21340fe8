# The rollout sandbox image for HF Sandbox (huggingface_hub.Sandbox.create(image=...)) for tasks without an image of
# their own; tasks that have one (SWE-Gym's, SWE-bench's) use that image instead. No agent is baked in: the hf backend
# uploads the harness's bundle (server/agents/bundle.py: its own Node or binary, checked against its digest inside)
# to /opt/swe-gym-agent at boot, in this image as in any other, so the agent versions live only in the harness
# classes. This image brings what a task and the bundle delivery need: git, patch, tar, gzip, sha256sum, Python, a
# non-root user, and the empty, agent-owned /opt/swe-gym-agent that user unpacks the bundle into.
#   docker build -f space_app/sandbox.Dockerfile --network host [--build-arg BASE=...] -t swe-gym-env/sandbox .
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
 && apt-get install -y --no-install-recommends git patch ca-certificates procps \
 && rm -rf /var/lib/apt/lists/* \
 && (apt-get purge -y nodejs 2>/dev/null || true) \
 && ! command -v node

RUN useradd --create-home --uid 1000 agent && install -d -o agent -g agent /opt/swe-gym-agent
ENV PATH=/usr/local/bin:/usr/bin:/bin
USER agent
WORKDIR /home/agent
CMD ["/bin/sh"]
