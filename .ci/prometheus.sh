#!/usr/bin/env bash
# Debian's Prometheus (`prometheus`, `promtool`) for the monitoring proof
# (tests/deploy/test_monitoring_proof.py) and the rule checks. Idempotent: installs only what is
# missing. The package's own service is never what the tests use (deploy/local/stack.py starts a
# Prometheus of its own on a free port, with our scrape config and rules), so it is kept from
# running: a service left on :9090 would only scrape nothing and hold the port.
set -euo pipefail

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    echo "prometheus: installing Debian's prometheus package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Recommends would add node-exporter and friends: not needed, and each is another service
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# The packaged service: stopped and disabled wherever an init system started it.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi

prometheus --version 2>&1 | sed -n 1p  # not head: SIGPIPE under pipefail
promtool --version 2>&1 | sed -n 1p
