#!/bin/sh
# The one-shot before the gateways start (Compose service `migrate`, Kubernetes Job
# `tiergate-migrate`): migrate the schema, seed the default tiers and the demo tenant, register
# the backends listed in BACKENDS_FILE. Safe to run again: each step leaves what exists alone.
#
# BACKENDS_FILE: one backend a line, `name url model profile kind` (see `tiergate backends add`);
# blank lines and lines starting with # are skipped.
set -eu

tiergate db upgrade
# Prints a demo API key the first time (once, in this container's log): revoke it with
# `tiergate keys revoke` where the stack is more than a trial.
tiergate db seed

file="${BACKENDS_FILE:-/etc/tiergate/backends.txt}"
if [ ! -f "$file" ]; then
    echo "no backends file at $file: register backends with 'tiergate backends add'"
    exit 0
fi
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$file" | while read -r name url model profile kind; do
    if out=$(tiergate backends add "$name" --url "$url" --model "$model" \
            --profile "$profile" --kind "$kind" 2>&1); then
        echo "$out"
    elif printf '%s' "$out" | grep -q "already exists"; then
        echo "backend $name: already registered"
    else
        printf '%s\n' "$out" >&2
        exit 1
    fi
done
