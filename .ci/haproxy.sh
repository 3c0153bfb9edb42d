#!/usr/bin/env bash
# Debian's HAProxy, for `haproxy -c` on the Compose stack's load-balancer config
# (tests/deploy/test_compose.py). Idempotent: installs only when `haproxy` is missing; the
# package's own service is stopped, since nothing here runs behind it.
set -euo pipefail

if ! command -v haproxy >/dev/null; then
    echo "haproxy: installing Debian's haproxy package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends haproxy >/dev/null
fi
if [ -x /etc/init.d/haproxy ]; then
    /etc/init.d/haproxy stop >/dev/null 2>&1 || true
fi
haproxy -v 2>&1 | sed -n 1p  # sed reads it all: head would SIGPIPE haproxy under pipefail
