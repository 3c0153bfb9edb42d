"""vLLM's own scheduler unit tests, run against stock vLLM and against TiergateScheduler.

The drop-in check of ``.ci/engines.sh``: the source distribution of the installed
vLLM carries ``tests/v1/core/``; this script extracts it (with the one helper module it imports,
``tests/v1/kv_connector/unit/utils.py``), runs the selected files once with vLLM's own scheduler
and once per policy with ours, and compares test by test. A test that passes with stock and not
with ours is a regression (exit status 1) unless ``.ci/vllm_suite_expected.txt`` lists it, with
a reason, as a policy-order difference; tests that fail with stock too do not count.

Nothing in the extracted files is edited. Run as a pytest plugin (``-p vllm_suite``), this module
changes only what must change to run offline on CPU, by rebinding names in the test modules
after collection:

* ``ModelConfig`` — the hub models the scheduler tests name only for their shape
  (``facebook/opt-125m``, ``facebook/opt-350m``) become local directories holding a
  ``config.json`` of that shape, with ``skip_tokenizer_init`` (there is no tokenizer offline);
* ``VllmConfig`` — a CPU ``DeviceConfig`` when the test gives none;
* ``Scheduler`` / ``AsyncScheduler`` (``tests/v1/core/utils.py``'s ``create_scheduler`` and the
  test files that construct a scheduler themselves) — our scheduler over that vLLM class, when
  the run is not the stock one (``TIERGATE_SUITE_POLICY``).

The sdist is fetched once per machine into ``.ci/venvs/sdists/`` (git-ignored, beside the
virtual environments), from the package index pip is configured with.

Usage (with the Python of a vLLM environment, e.g. ``.ci/venvs/vllm-0.33/bin/python``)::

    python .ci/vllm_suite.py [--policies stock,vllm-v1,...] [--files F ...] [-k EXPR] [--jobs N]
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / "venvs" / "sdists"
EXPECTED = HERE / "vllm_suite_expected.txt"

FILES = (
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    "tests/v1/core/test_priority_preemption_bug.py",
)
"""The scheduler's own tests (a version lacking one of them simply runs the others)."""
MEMBERS = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/core/")
HELPERS = (
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)
"""Imported by ``tests/v1/core/utils.py`` (the mock KV connector)."""
POLICIES = (
    "stock",
    "vllm-v1",
    "vllm-v1-priority",
    "slide",
    "gmax",
    "gmax-fair",
    "tempo",
    "slos-serve",
)

# ---- the driver ------------------------------------------------------------------------------


def vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm")


def index_urls() -> list[str]:
    """The package indexes pip uses here: its configuration (files and ``PIP_*``), else pip's
    default index."""
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    main: str | None = None
    extra: list[str] = []
    for line in config.splitlines():
        key, _, value = line.partition("=")
        value = value.strip().strip("'\"")
        if key.endswith(".index-url") and not key.endswith("extra-index-url"):
            main = value
        elif key.endswith(".extra-index-url"):
            extra += value.split()
    if main is None:
        from pip._internal.models.index import PyPI

        main = PyPI.simple_url
    return [main, *[u for u in extra if u != main]]


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def _read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=300) as response:
        data: bytes = response.read()
    return data


def fetch_sdist(version: str) -> Path:
    """``vllm-<version>.tar.gz`` from the cache, downloaded from the index on first use."""
    name = f"vllm-{version}.tar.gz"
    target = CACHE / name
    if target.exists():
        return target
    for index in index_urls():
        page_url = index.rstrip("/") + "/vllm/"
        try:
            page = _read(page_url).decode("utf-8", "replace")
        except OSError:
            continue
        parser = _Links()
        parser.feed(page)
        for href in parser.links:
            url = urllib.parse.urljoin(page_url, href)
            path, _, fragment = url.partition("#")
            if urllib.parse.unquote(path.rsplit("/", 1)[-1]) != name:
                continue
            data = _read(path)
            algo, _, digest = fragment.partition("=")
            if (
                algo in hashlib.algorithms_available
                and digest
                and hashlib.new(algo, data).hexdigest() != digest
            ):
                raise SystemExit(f"{name}: {algo} mismatch from the index")
            CACHE.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".part")
            partial.write_bytes(data)
            partial.replace(target)
            return target
    raise SystemExit(f"{name} is on none of pip's indexes")


def extract(sdist: Path, into: Path) -> Path:
    """The scheduler tests (and their helper) of ``sdist`` under ``into``; the tree's root."""
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/", 1)[0]
        wanted = [
            m
            for m in tar.getmembers()
            if m.isfile()
            and any(
                m.name == f"{top}/{p}" or (p.endswith("/") and m.name.startswith(f"{top}/{p}"))
                for p in (*MEMBERS, *HELPERS)
            )
        ]
        tar.extractall(into, members=wanted, filter="data")
    return into / top


def run_policy(policy: str, tree: Path, files: list[str], keyword: str | None, out: Path) -> Any:
    """Start pytest on ``files`` with ``policy`` ("stock": vLLM's own scheduler)."""
    env = dict(os.environ)
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_LOGGING_LEVEL="ERROR",
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")]),
        TIERGATE_SUITE_POLICY=policy,
    )
    for key in [k for k in env if k.startswith("TIERGATE_") and k != "TIERGATE_SUITE_POLICY"]:
        del env[key]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "vllm_suite",
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=line",
        "-o",
        "junit_family=xunit2",
        f"--junitxml={out}",
        *files,
    ]
    if keyword:
        cmd += ["-k", keyword]
    log = out.with_suffix(".log").open("w")
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | skipped}`` from pytest's JUnit XML."""
    result: dict[str, str] = {}
    if not junit.exists():
        return result
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result[test_id] = "failed"
        elif case.find("skipped") is not None:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def expected_differences(version: str) -> dict[tuple[str, str], str]:
    """``{(policy, test id): reason}`` for this vLLM version (major.minor)."""
    minor = ".".join(version.split(".")[:2])
    allowed: dict[tuple[str, str], str] = {}
    for line in EXPECTED.read_text().splitlines():
        entry, _, reason = line.partition("#")
        fields = entry.split()
        if not fields:
            continue
        if len(fields) != 3 or not reason.strip():
            raise SystemExit(f"{EXPECTED.name}: want 'VERSION POLICY TEST  # reason': {line!r}")
        if fields[0] == minor:
            allowed[(fields[1], fields[2])] = reason.strip()
    return allowed


def per_file(results: dict[str, str], outcome: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for test_id, got in results.items():
        if got == outcome:
            name = test_id.split("::")[0].rsplit(".", 1)[-1]
            counts[name] = counts.get(name, 0) + 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--files", nargs="*", default=list(FILES))
    parser.add_argument("-k", dest="keyword", default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    policies = args.policies.split(",")
    if "stock" not in policies:
        policies.insert(0, "stock")
    version = vllm_version()
    minor = ".".join(version.split(".")[:2])
    started = time.monotonic()
    sdist = fetch_sdist(version)
    work = Path(tempfile.mkdtemp(prefix=f"vllm-suite-{minor}-"))
    try:
        tree = extract(sdist, work)
        files = [f for f in args.files if (tree / f).exists()]
        running: list[tuple[str, Any]] = []
        results: dict[str, dict[str, str]] = {}
        queue = list(policies)
        while queue or running:
            while queue and len(running) < max(1, args.jobs):
                policy = queue.pop(0)
                proc = run_policy(policy, tree, files, args.keyword, work / f"{policy}.xml")
                running.append((policy, proc))
            policy, proc = running.pop(0)
            proc.wait()
            results[policy] = outcomes(work / f"{policy}.xml")
            if not results[policy]:
                print((work / f"{policy}.xml").with_suffix(".log").read_text()[-4000:])
                raise SystemExit(f"vllm {minor} suite: the {policy} run produced no results")
        report = compare(minor, version, results)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"vllm {minor} suite time: {time.monotonic() - started:.0f} s")
    return report


def compare(minor: str, version: str, results: dict[str, dict[str, str]]) -> int:
    """Print the per-file counts, the differences and the summary; 1 on any regression."""
    stock = results["stock"]
    allowed = expected_differences(version)
    passing = {t for t, o in stock.items() if o == "passed"}
    regressions: list[str] = []
    summary = [f"stock {len(passing)} passed"]
    for policy, got in results.items():
        if policy == "stock":
            continue
        lost = sorted(t for t in passing if got.get(t) != "passed")
        expected = [t for t in lost if (policy, t) in allowed]
        unexpected = [t for t in lost if (policy, t) not in allowed]
        gained = sorted(t for t, o in got.items() if o == "passed" and t not in passing)
        n = sum(1 for o in got.values() if o == "passed")
        gaps = [t for t in expected if allowed[(policy, t)].startswith("gap:")]
        line = f"{policy} {n} passed"
        if len(expected) > len(gaps):
            line += f" ({len(expected) - len(gaps)} expected policy-order differences)"
        if gaps:
            line += f", {len(gaps)} KNOWN GAPS"
        if unexpected:
            line += f", {len(unexpected)} REGRESSIONS"
        summary.append(line)
        for t in expected:
            kind = "KNOWN GAP" if t in gaps else "expected difference"
            print(f"  {policy}: {kind} {t}: {allowed[(policy, t)]}")
        for t in unexpected:
            regressions.append(f"{policy}: {t}")
        for t in gained:
            print(f"  {policy}: passes where stock does not: {t}")
        stale = [t for (p, t) in allowed if p == policy and t not in lost and t in passing]
        for t in stale:
            print(f"  {policy}: listed as an expected difference but passes: {t}")
    for policy, got in results.items():
        counts = per_file(got, "passed")
        print(f"  {policy:17s} passed per file: {json.dumps(counts, sort_keys=True)}")
    for r in regressions:
        print(f"  REGRESSION {r}")
    print(f"vllm {minor} suite: " + "; ".join(summary) + f" (of {len(stock)} tests, {version})")
    return 1 if regressions else 0


# ---- the pytest plugin (``-p vllm_suite``, inside the extracted tree) -------------------------

_OPT_COMMON: dict[str, Any] = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "torch_dtype": "float16",
}
LOCAL_MODELS: dict[str, dict[str, Any]] = {
    "facebook/opt-125m": {
        **_OPT_COMMON,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "ffn_dim": 3072,
        "word_embed_proj_dim": 768,
        "do_layer_norm_before": True,
    },
    "facebook/opt-350m": {
        **_OPT_COMMON,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "ffn_dim": 4096,
        "word_embed_proj_dim": 512,
        "do_layer_norm_before": False,
    },
}
"""The shapes of the hub models the scheduler tests use (only the shape matters to them)."""

_model_dirs: dict[str, str] = {}


def pytest_configure(config: Any) -> None:
    root = Path(tempfile.mkdtemp(prefix="vllm-suite-models-"))
    for name, hf_config in LOCAL_MODELS.items():
        directory = root / name.replace("/", "--")
        directory.mkdir(parents=True)
        (directory / "config.json").write_text(json.dumps(hf_config))
        _model_dirs[name] = str(directory)


def _test_modules() -> Iterator[Any]:
    for name, module in list(sys.modules.items()):
        if name.startswith("tests.") and module is not None:
            yield module


def _suite_class(base: type, policy: str) -> type:
    """Our scheduler over ``base``, started with ``policy``.

    ``vllm-v1`` is the transcription of vLLM's ``--scheduling-policy fcfs``; a test that
    configures vLLM's priority scheduling gets its transcription, ``vllm-v1-priority``, as a
    deployment would choose it.
    """
    from engine_cuda.scheduler import TiergateScheduler

    ours: Any = TiergateScheduler.over(base)

    class SuiteScheduler(ours):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
            chosen = policy
            if policy == "vllm-v1" and config.scheduler_config.policy == "priority":
                chosen = "vllm-v1-priority"
            os.environ["TIERGATE_POLICY"] = chosen
            super().__init__(*args, **kwargs)

    SuiteScheduler.__name__ = SuiteScheduler.__qualname__ = ours.__name__
    return SuiteScheduler


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """Rebind the names listed in the module docstring, in every imported test module."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    def model_config(*args: Any, **kwargs: Any) -> Any:
        if args:
            kwargs.setdefault("model", args[0])
            args = args[1:]
        local = _model_dirs.get(kwargs.get("model", "facebook/opt-125m"))
        if local is not None:
            kwargs["model"] = local
            kwargs["skip_tokenizer_init"] = True
        return ModelConfig(*args, **kwargs)

    def vllm_config(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("device_config", DeviceConfig(device="cpu"))
        return VllmConfig(*args, **kwargs)

    policy = os.environ.get("TIERGATE_SUITE_POLICY", "stock")
    replacements: dict[str, Any] = {"ModelConfig": model_config, "VllmConfig": vllm_config}
    if policy != "stock":
        if policy.startswith("vllm-v1") and vllm_version().startswith("0.23"):
            os.environ["TIERGATE_POLICY_PARAMS"] = json.dumps({"version": "0.23"})
        replacements["Scheduler"] = _suite_class(Scheduler, policy)
        replacements["AsyncScheduler"] = _suite_class(AsyncScheduler, policy)
    for module in _test_modules():
        for name, value in replacements.items():
            if name in vars(module):
                setattr(module, name, value)


if __name__ == "__main__":
    sys.exit(main())
