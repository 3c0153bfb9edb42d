"""The docs stay true to the code: every module is on the architecture map, no tracker tags.

`docs/architecture.md` is where a newcomer finds a module; a module missing from it is a
module nobody finds. The rule the map follows (stated at its top) is checked here:

- a module is named by its path from the repository root (`gateway/app/auth.py`), or
- by its file name in a table row that names its folder or a sibling's full path
  (`engine_emulated/` … `loop.py`; `priority/policies/gmax.py`, `tempo.py`), or
- by its package folder in a row that says "one module per …" (`gateway/db/crud/`);
- a package's `__init__.py` / `__main__.py` is covered by its folder being named.

And every path the map names exists, so a renamed module cannot leave a stale entry.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "architecture.md"
PACKAGES = (
    "priority",
    "gateway",
    "engine_common",
    "engine_cuda",
    "engine_ascend",
    "engine_emulated",
    "engine_harness",
    "admin_ui",
)
TOP_LEVEL = ("tiergate_cli.py",)
# A backticked token that is a repository path (not a URL path such as `/v1/models`).
_PATH = re.compile(r"^[A-Za-z_.][\w.\-]*(/[\w.\-]+)*/?$")
_TICKS = re.compile(r"`([^`]+)`")


def _modules() -> set[str]:
    found = {
        str(p.relative_to(ROOT))
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    found.update(t for t in TOP_LEVEL if (ROOT / t).exists())
    return found


def _tokens(line: str) -> list[str]:
    return [t for t in _TICKS.findall(line) if _PATH.match(t)]


def _covered(text: str) -> set[str]:
    """Every module path the map covers under the rule above."""
    named: set[str] = set()
    folders: set[str] = set()
    for line in text.splitlines():
        tokens = _tokens(line)
        row_dirs = {t for t in tokens if t.endswith("/")}
        row_dirs |= {t.rsplit("/", 1)[0] + "/" for t in tokens if "/" in t and t.endswith(".py")}
        folders |= {t for t in tokens if t.endswith("/")}
        for t in tokens:
            if t.endswith(".py"):
                named.add(t)
                for d in row_dirs:
                    named.add(d + t)
        if "one module per" in line:
            named |= {f"{d}*" for d in row_dirs}
    for d in folders:
        named.add(d + "__init__.py")
        named.add(d + "__main__.py")
    return named


def _is_covered(module: str, covered: set[str]) -> bool:
    if module in covered:
        return True
    folder = module.rsplit("/", 1)[0] + "/"
    return folder + "*" in covered


def test_every_module_is_on_the_map() -> None:
    covered = _covered(MAP.read_text())
    missing = sorted(m for m in _modules() if not _is_covered(m, covered))
    assert not missing, f"modules missing from docs/architecture.md: {missing}"


def test_every_path_the_map_names_exists() -> None:
    stale = []
    for line in MAP.read_text().splitlines():
        for t in _tokens(line):
            if "/" in t and (t.endswith(".py") or t.endswith("/")) and not (ROOT / t).exists():
                stale.append(t)
    assert not stale, f"docs/architecture.md names paths that do not exist: {sorted(set(stale))}"


def test_the_rule_catches_a_missing_module() -> None:
    """The checker itself: a module named nowhere is not covered, one named is."""
    text = "| x | `gateway/db/crud/` (one module per table) | y |\n| a | `priority/sim/` `kv.py` |"
    covered = _covered(text)
    assert _is_covered("gateway/db/crud/tiers.py", covered)
    assert _is_covered("priority/sim/kv.py", covered)
    assert _is_covered("priority/sim/__init__.py", covered)
    assert not _is_covered("priority/sim/engine.py", covered)
    assert not _is_covered("gateway/app/proxy.py", covered)


_TAG = re.compile(r"\b[Ii]ssue\s+#?[0-9]+\b|\bpart [A-F]\b")
"""``issue 14``, ``Issue #3``, ``part D``: work items of a tracker outside the repository."""


def test_no_tracker_tags_in_code() -> None:
    """Comments and docstrings say what they mean, not which ticket asked for it."""
    assert _TAG.search("# issue 14: kinds") and _TAG.search("(part D: overload)")
    assert not _TAG.search("part of the issue: 14 requests")
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if not path.exists():
            continue
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _TAG.search(line) and name != "tests/test_architecture_map.py":
                hits.append(f"{name}:{no}: {line.strip()}")
    assert not hits, "tracker tags in code:\n" + "\n".join(hits)


def test_readme_lists_every_policy() -> None:
    """The README's policy list is the registry's, so a new policy cannot go unlisted."""
    from priority.policies import POLICY_NAMES

    readme = (ROOT / "README.md").read_text()
    start = readme.index("- Policies (")
    listed = set(
        re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", readme[start : readme.index("Routers", start)])
    )
    missing = [name for name in POLICY_NAMES if name not in listed]
    assert not missing, f"README's policy list misses {missing}"
    assert f"the {len(POLICY_NAMES)} names" in readme[start : start + 80]


def test_every_bench_has_a_readme_line() -> None:
    """Each script in ``bench/`` is introduced in ``bench/README.md``."""
    readme = (ROOT / "bench" / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "bench").glob("*.py")) if f"`{p.name}`" not in readme]
    assert not missing, f"bench/README.md has no line for {missing}"


def test_results_is_a_headline_table_with_commands() -> None:
    """``docs/results.md`` stays readable (the dated history lives in ``results-history.md``)
    and every headline row says how to reproduce its number."""
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(text.splitlines()) <= 150
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    body = [r for r in rows[1:] if not r.startswith("| **")]  # header and group rows aside
    assert len(body) >= 30
    commandless = [r[:60] for r in body if "`" not in r.rstrip(" |").rsplit("|", 1)[-1]]
    assert not commandless, f"headline rows without a command: {commandless}"
