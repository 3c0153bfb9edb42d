#!/usr/bin/env bash
# LiteLLM's environment for the short side-by-side run in tests/test_bench_vs_litellm.py:
# bench/litellm/setup.sh builds it once (about a minute) and reuses it while its lock file is
# unchanged. It comes from the package registry; a registry that cannot serve it must not fail
# CI for the rest of the project, so a failed build is reported here and that test then skips,
# saying why.
set -uo pipefail
cd "$(dirname "$0")/.."
if venv=$(bash bench/litellm/setup.sh); then
    echo "litellm: $venv ready"
else
    echo "litellm: bench/litellm/setup.sh failed; tests/test_bench_vs_litellm.py will skip its run" >&2
fi
exit 0
