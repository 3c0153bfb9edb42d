#!/usr/bin/env bash
# The LiteLLM proxy that bench/vs_litellm.py compares tiergate with, in a virtual environment of
# its own: bench/.venvs/litellm-<version> (git-ignored), built once and reused while its inputs
# (this recipe, the Python version, the lock file) are unchanged.
#
# Every recent LiteLLM release requires certifi >= 2026.10.19, newer than some registries serve.
# So LiteLLM itself goes in with --no-deps, and its requirements from the lock file
# requirements-<version>.txt: the wheel's own Requires-Dist (base plus the `proxy` extra), minus
# that certifi pin, resolved and frozen once (`--relock` redoes it). certifi stays unpinned, and
# the proxy runs with LITELLM_LOCAL_MODEL_COST_MAP=True so it never fetches its cost map.
# LiteLLM's database (Prisma) is not installed: its engines are downloaded at run time from a
# host this machine cannot reach; the bench authenticates with a custom_auth hook instead.
#
# Usage: bench/litellm/setup.sh [--relock]     prints the venv's path on success
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=1.108.0
RECIPE=1 # bump when the build steps below change
PYTHON=${PYTHON:-python3}
LOCK=bench/litellm/requirements-$VERSION.txt
VENV=bench/.venvs/litellm-$VERSION
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)

quiet() { # pip's notes on the machine's absent local indexes are noise
    "$@" 2> >(grep -v '^WARNING: Location' >&2)
}

relock() { # the wheel's requirements (base + proxy extra) minus certifi, resolved and frozen
    local tmp
    tmp=$(mktemp -d)
    quiet "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$tmp" \
        "litellm==$VERSION"
    "$VENV/bin/python" - "$tmp"/litellm-*.whl > "$tmp/reqs.txt" <<'EOF'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name == "certifi":
        continue
    if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", "proxy")):
        req.marker = None
        print(req)
EOF
    quiet "${PIP[@]}" -r "$tmp/reqs.txt"
    { echo "# bench/litellm/setup.sh --relock: litellm==$VERSION's requirements (proxy extra),"
      echo "# certifi left unpinned; frozen with $("$PYTHON" --version)"
      "$VENV/bin/pip" freeze --disable-pip-version-check --exclude-editable |
          grep -viE '^(litellm|certifi|pip|setuptools|wheel)[ =@]'; } > "$LOCK"
    rm -rf "$tmp"
}

stamp=$( (echo "recipe=$RECIPE"; "$PYTHON" --version; cat "$LOCK") | sha256sum | cut -d' ' -f1)
if [ "${1:-}" != --relock ] && [ -f "$VENV/.tiergate-stamp" ] \
    && [ "$(cat "$VENV/.tiergate-stamp")" = "$stamp" ]; then
    echo "$VENV"
    exit 0
fi
echo "litellm-$VERSION: building $VENV" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
quiet "${PIP[@]}" --no-deps "litellm==$VERSION"
if [ "${1:-}" = --relock ]; then
    relock
    stamp=$( (echo "recipe=$RECIPE"; "$PYTHON" --version; cat "$LOCK") | sha256sum | cut -d' ' -f1)
else
    quiet "${PIP[@]}" -r "$LOCK" # certifi comes in unpinned, as a requirement of the others
fi
LITELLM_LOCAL_MODEL_COST_MAP=True "$VENV/bin/python" -c "import litellm.proxy.proxy_server" # fails here, not in the bench
echo "$stamp" > "$VENV/.tiergate-stamp"
echo "litellm-$VERSION: built" >&2
echo "$VENV"
