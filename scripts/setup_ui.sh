#!/usr/bin/env bash
# Headless Chromium for the browser tests (tests/test_ui.py drives Debian's chromium through Playwright's Python
# package, pointed at /usr/bin/chromium; no Playwright browser download). Idempotent; needs root (CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi
/usr/bin/chromium --version
