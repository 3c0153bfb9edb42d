#!/usr/bin/env bash
# Debian's Chromium for the Playwright tests (tests/browser/): Playwright's own browser download
# cannot work on these machines, so the tests drive the system binary instead. Idempotent: does
# nothing when `chromium` is already on PATH.
set -euo pipefail

if command -v chromium >/dev/null; then
    echo "browser: $(chromium --version 2>/dev/null || echo chromium) already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
    echo "browser: chromium is missing and this user cannot install it" >&2
    exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "browser: installing Debian's chromium"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium
echo "browser: $(chromium --version 2>/dev/null || echo chromium) installed"
