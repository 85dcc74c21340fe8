#!/usr/bin/env bash
# The `docker` sandbox backend's test bed, idempotent (CI runs it as root on a clean machine):
#   1. Debian's docker.io and debootstrap, if missing;
#   2. a dockerd with no bridge and no iptables (containers run with --network none; the capture relay is a unix
#      socket mounted in), started only if no daemon answers; pidfile and log under $SWE_GYM_DOCKER_STATE;
#   3. the base image $SWE_GYM_DOCKER_IMAGE, built from a Debian root filesystem (debootstrap) + `docker import`,
#      because registries cannot be pulled from here. It carries what the bundled tasks and the agent need:
#      python3 (3.11, the same as the host's, so the host's task runtime venv mounts in as in `local`), git, patch,
#      node (for the agent CLI, whose install is mounted read-only), procps and util-linux (setsid, kill).
# usage: scripts/setup_docker.sh [start|stop|status]   (default: start)
set -euo pipefail

STATE=${SWE_GYM_DOCKER_STATE:-/var/lib/swe-gym-docker}
IMAGE=${SWE_GYM_DOCKER_IMAGE:-swe-gym-env/base:bookworm}
MIRROR=${SWE_GYM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PIDFILE=$STATE/dockerd.pid
LOG=$STATE/dockerd.log
ROOTFS_TAR=$STATE/rootfs-bookworm.tar

daemon_up() { docker info >/dev/null 2>&1; }

stop() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    echo "dockerd stopped"
  fi
  rm -f "$PIDFILE"
}

start() {
  if [ "$(id -u)" != 0 ]; then
    daemon_up && docker image inspect "$IMAGE" >/dev/null 2>&1 && exit 0
    echo "setup_docker.sh must run as root (apt, dockerd); or start a docker daemon with $IMAGE yourself" >&2
    exit 1
  fi
  mkdir -p "$STATE"
  need=()
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if ! daemon_up; then
    setsid dockerd --bridge=none --iptables=false --ip-masq=false --pidfile "$PIDFILE" --data-root "$STATE/data" \
      --exec-root "$STATE/exec" >"$LOG" 2>&1 < /dev/null &
    for _ in $(seq 150); do daemon_up && break; sleep 0.2; done
    daemon_up || { echo "dockerd did not start; log: $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
    echo "dockerd started (pid $(cat "$PIDFILE"), log $LOG)"
  fi
  if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    if [ ! -s "$ROOTFS_TAR" ]; then
      rm -rf "$STATE/rootfs"
      debootstrap --variant=minbase --include=python3,git,patch,nodejs,procps,ca-certificates \
        bookworm "$STATE/rootfs" "$MIRROR" >"$STATE/debootstrap.log" 2>&1 \
        || { echo "debootstrap failed; log: $STATE/debootstrap.log" >&2; tail -20 "$STATE/debootstrap.log" >&2; exit 1; }
      rm -rf "$STATE/rootfs/var/cache/apt/archives/"*.deb "$STATE/rootfs/var/lib/apt/lists/"*
      tar -C "$STATE/rootfs" -cf "$ROOTFS_TAR.tmp" . && mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
      rm -rf "$STATE/rootfs"
    fi
    docker import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$ROOTFS_TAR" "$IMAGE" >/dev/null
    echo "image $IMAGE imported"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) daemon_up && docker image inspect "$IMAGE" >/dev/null 2>&1 && echo up || { echo down; exit 1; } ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
