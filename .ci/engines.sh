#!/usr/bin/env bash
# The engine-integration job: our scheduler inside the real vLLM scheduler, per vLLM version.
#
# For each version it keeps a virtual environment under .ci/venvs/vllm-<version> holding the
# machine's CPU torch, `vllm==<version>` installed with --no-deps (its CUDA pins cannot install
# here), the pure-Python needs pinned in .ci/engines-requirements-<version>.txt, and this project
# (editable, --no-deps). An environment is rebuilt only when its inputs change: the hash of the
# requirements file and of this script's recipe is stored inside it. Then it runs the `vllm`
# marked tests of tests/engines/ in that environment and prints pytest's summary line, and
# vLLM's own scheduler tests against stock vLLM and TiergateScheduler (.ci/vllm_suite.py; the
# sdist is cached in .ci/venvs/sdists/) and prints their summary line: a test that passes with
# stock and fails with ours, unless listed in .ci/vllm_suite_expected.txt, fails this job.
#
# Set TIERGATE_VLLM_SUITE=0 to skip vLLM's own tests.
#
# Usage: .ci/engines.sh [--build-only] [VERSION ...]     (default versions: 0.33 0.23)
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=3 # bump when the build steps below change
PYTHON=${PYTHON:-python3}
build_only=0
versions=()
for arg in "$@"; do
    case "$arg" in
        --build-only) build_only=1 ;;
        -h|--help) sed -n 2,16p "$0"; exit 0 ;;
        *) versions+=("$arg") ;;
    esac
done
[ ${#versions[@]} -gt 0 ] || versions=(0.33 0.23)

pin_of() { # the `name==version` pin of package $1 in requirements file $2
    grep -m 1 -E "^$1==" "$2"
}

install_project() { # (re)install this project, editable, when pyproject.toml changed
    local venv=$1 stamp
    stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ "$(cat "$venv/.tiergate-project" 2>/dev/null)" != "$stamp" ]; then
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e . \
            2> >(grep -v '^WARNING: Location' >&2)
        echo "$stamp" > "$venv/.tiergate-project"
    fi
}

build() { # build (or reuse) the environment of version $1; prints its path
    local version=$1
    local req=.ci/engines-requirements-$version.txt
    local venv=.ci/venvs/vllm-$version
    [ -f "$req" ] || { echo "no requirements file $req" >&2; return 1; }
    local stamp
    stamp=$( (echo "recipe=$RECIPE"; "$PYTHON" --version; cat "$req") | sha256sum | cut -d' ' -f1)
    if [ -f "$venv/.tiergate-stamp" ] && [ "$(cat "$venv/.tiergate-stamp")" = "$stamp" ]; then
        echo "vllm-$version: environment up to date ($venv)" >&2
        install_project "$venv"
        return 0
    fi
    echo "vllm-$version: building $venv" >&2
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    local pip=("$venv/bin/pip" install -q --disable-pip-version-check)
    exec 3>&2 2> >(grep -v '^WARNING: Location' >&3) # pip's notes on absent local indexes
    local vllm_pin torch_pin
    vllm_pin=$(pin_of vllm "$req")
    torch_pin=$(pin_of torch "$req")
    "${pip[@]}" "$torch_pin"                      # the local CPU wheel
    "${pip[@]}" --no-deps "$vllm_pin"             # its CUDA pins are not installable here
    local rest constraints
    rest=$(mktemp)
    constraints=$(mktemp)
    grep -vE '^(vllm|torch)==' "$req" > "$rest"
    echo "$torch_pin" > "$constraints"           # nothing may replace the CPU torch
    "${pip[@]}" -r "$rest" -c "$constraints"
    rm -f "$rest" "$constraints"
    exec 2>&3 3>&-
    echo "$stamp" > "$venv/.tiergate-stamp"
    install_project "$venv"
    echo "vllm-$version: built" >&2
}

status=0
for version in "${versions[@]}"; do
    build "$version"
done
[ "$build_only" = 1 ] && exit 0

for version in "${versions[@]}"; do
    venv=.ci/venvs/vllm-$version
    log=$(mktemp)
    set +e
    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING \
        "$venv/bin/python" -m pytest -q -m vllm -p no:cacheprovider tests/engines > "$log" 2>&1
    rc=$?
    set -e
    if [ $rc -ne 0 ]; then
        cat "$log"
        status=1
    fi
    echo "vllm $version: $(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -n 1)"
    if [ "${TIERGATE_VLLM_SUITE:-1}" != 0 ]; then
        set +e
        "$venv/bin/python" .ci/vllm_suite.py > "$log" 2>&1
        rc=$?
        set -e
        if [ $rc -ne 0 ]; then
            cat "$log" # the differences, per-file counts and the summary line
            status=1
        else
            grep -E "^vllm $version suite" "$log" || true
        fi
    fi
    rm -f "$log"
done
exit $status
