#!/usr/bin/env bash
# vLLM's own router (vllm-router, a Rust wheel) for the short side-by-side run in
# tests/test_bench_vs_router.py: bench/vs_router.py builds its venv once (bench/.venvs/) and reuses
# it. A registry that cannot serve it must not fail CI for the rest of the project: a failed build
# is reported here and that test then skips, saying why.
set -uo pipefail
cd "$(dirname "$0")/.."
if .venv/bin/python -c 'import sys; sys.path.insert(0, "bench"); import vs_router; print(vs_router.ensure_router())'; then
    echo "vllm-router: ready"
else
    echo "vllm-router: could not be installed; tests/test_bench_vs_router.py will skip its run" >&2
fi
exit 0
