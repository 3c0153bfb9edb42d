"""Layers that point one way, and the install that lets each layer stand alone.

From the bottom: the scheduling core (``priority``) imports no gateway and no web framework; the
engine plugins (``engine_common``, ``engine_cuda``, ``engine_ascend``) import no gateway, the
shared ``engine_common`` imports no plugin, and the Ascend plugin shares code with the CUDA one
only through ``engine_common``; the emulated engine (``engine_emulated``) sits beside the
plugins, and the gateway never imports it. The ``tiergate`` console script (``tiergate_cli.py``,
a top-level module) is the one place above all of them.

The core is also imported for real, in a subprocess where the gateway and the web stack cannot be
imported at all, which is how it runs beside vLLM; ``pyproject.toml``'s package list and its
``core``/``engine`` dependency groups are checked against the tree and the imports.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

WEB = frozenset(
    {
        "fastapi",
        "starlette",
        "uvicorn",
        "sqlalchemy",
        "alembic",
        "httpx",
        "aiohttp",
        "jinja2",
        "psycopg",
        "redis",
        "websockets",
    }
)
"""Top-level modules of the gateway's web stack (server, HTTP clients, database)."""
ABOVE_CORE = frozenset({"gateway", "tiergate_cli"})
PLUGINS = frozenset({"engine_cuda", "engine_ascend", "engine_emulated"})
"""The engines built on ``engine_common``: the two vLLM plugins and the emulated engine."""
FIRST_PARTY = frozenset(
    {"priority", "gateway", "engine_common", "engine_harness", "admin_ui"} | PLUGINS
)
OPTIONAL = frozenset(
    {"vllm", "vllm_ascend", "torch", "torch_npu", "pyarrow", "sklearn", "quantile_forest"}
)
"""Imported lazily where they are needed: vLLM and its platform plugin (installed by the user),
torch (the profilers, the ``profile`` extra), pyarrow (deriving profiles, a build-time tool),
scikit-learn and quantile-forest (the length predictor, which the gateway runs; the engines
refine its distribution without them)."""


def modules(package: str) -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module under ``package``'s folder."""
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imported(name: str, path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy and TYPE_CHECKING imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = name.split(".")
                base = package[: len(package) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def violations(packages: tuple[str, ...], forbidden: frozenset[str]) -> list[str]:
    """``module -> import`` for every import of a forbidden module (or of a submodule of one)."""

    def hit(target: str) -> bool:
        return any(target == f or target.startswith(f"{f}.") for f in forbidden)

    return sorted(
        f"{name} -> {target}"
        for package in packages
        for name, path in modules(package)
        for target in imported(name, path)
        if hit(target)
    )


def _under(target: str, allowed: frozenset[str]) -> bool:
    """``target`` is one of ``allowed`` or a name inside one (``gateway.heap.freeze``)."""
    return any(target == a or target.startswith(f"{a}.") for a in allowed)


# ---- static rules ------------------------------------------------------------------------------


def test_the_core_imports_no_gateway_and_no_web_framework() -> None:
    assert violations(("priority",), ABOVE_CORE | WEB) == []


def test_the_engine_plugins_import_no_gateway_and_no_web_framework() -> None:
    packages = ("engine_common", "engine_cuda", "engine_ascend")
    assert violations(packages, ABOVE_CORE | WEB) == []


def test_the_ascend_plugin_shares_code_with_the_cuda_one_only_through_engine_common() -> None:
    assert violations(("engine_ascend",), frozenset({"engine_cuda"})) == []


def test_engine_common_imports_no_plugin() -> None:
    """The shared layer is shared: a plugin may import it, never the other way round."""
    assert violations(("engine_common",), PLUGINS | {"engine_harness"}) == []


def test_the_replay_harness_is_imported_by_no_runtime_package() -> None:
    """The replays check the engines from above: no engine, plugin, core or gateway module
    imports them, and they import no gateway."""
    runtime = ("priority", "gateway", "engine_common", *sorted(PLUGINS))
    assert violations(runtime, frozenset({"engine_harness"})) == []
    assert violations(("engine_harness",), ABOVE_CORE | WEB) == []


def test_the_gateway_never_imports_the_emulated_engine() -> None:
    """The gateway runs unchanged in front of real engines: it never imports the emulated one.
    The assembler that starts emulated engines for ``tiergate serve`` is ``tiergate_cli``."""
    assert violations(("gateway",), frozenset({"engine_emulated"})) == []


EMULATED_ENGINE_TAKES_FROM_THE_GATEWAY = frozenset(
    {"gateway.embedded", "gateway.heap", "gateway.histogram", "gateway.jsonbody", "gateway.tokens"}
)
"""Helpers the emulated engine shares with the gateway (an embedded uvicorn server, start-up heap
freezing, the streamed-ITL histogram, JSON nesting checks, prompt token counting): small leaf
modules, not the data plane."""


def test_the_emulated_engine_takes_only_leaf_helpers_from_the_gateway() -> None:
    found = {
        v.partition(" -> ")[2] for v in violations(("engine_emulated",), frozenset({"gateway"}))
    }
    assert (
        found
        and {t for t in found if not _under(t, EMULATED_ENGINE_TAKES_FROM_THE_GATEWAY)} == set()
    )
    for helper in sorted(EMULATED_ENGINE_TAKES_FROM_THE_GATEWAY):  # and they stay leaves
        ours = {
            target
            for target in imported(helper, ROOT / (helper.replace(".", "/") + ".py"))
            if target.partition(".")[0] in FIRST_PARTY
        }
        assert ours == set(), (helper, ours)


def test_the_dashboard_files_are_data_only() -> None:
    """``admin_ui`` only says where its templates and assets are; the gateway renders them
    (``gateway/app/ui/``), so the dashboard's package imports nothing of ours or of the web."""
    assert violations(("admin_ui",), FIRST_PARTY - {"admin_ui"} | WEB | ABOVE_CORE) == []


def test_the_console_script_is_assembled_above_every_layer() -> None:
    assert PYPROJECT["project"]["scripts"] == {"tiergate": "tiergate_cli:app"}
    above = imported("tiergate_cli", ROOT / "tiergate_cli.py")
    assert {"priority.cli", "gateway.cli", "gateway.serve", "engine_emulated.cli"} <= above
    # nothing of the repository imports the assembler
    packages = ("priority", "gateway", "engine_common", *sorted(PLUGINS))
    assert violations(packages, frozenset({"tiergate_cli"})) == []


# ---- the core imported with the web stack absent -----------------------------------------------

BLOCKED_IMPORT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = frozenset(sys.argv[1].split(","))

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Blocked())
    import priority

    names = ["priority"]
    for info in pkgutil.walk_packages(priority.__path__, "priority."):
        if info.name.rpartition(".")[2] != "__main__":  # would run the CLI
            importlib.import_module(info.name)
            names.append(info.name)

    from typer.testing import CliRunner
    from priority.cli import app

    for args in (["--help"], ["profile", "list"], ["sim", "--help"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(len(names))
    """
)


def test_the_core_and_its_cli_import_with_the_gateway_stack_blocked() -> None:
    blocked = sorted(ABOVE_CORE | WEB | {"engine_cuda", "engine_ascend"})
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT, ",".join(blocked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    imported_count = int(result.stdout.split()[-1])
    assert imported_count == len(list(modules("priority"))) - 1  # all but __main__


# ---- pyproject.toml ----------------------------------------------------------------------------


def test_the_package_list_names_exactly_the_packages_that_exist() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    patterns = setuptools["packages"]["find"]["include"]
    named = {p.removesuffix(".*") for p in patterns}
    assert all(f"{name}.*" in patterns and name in patterns for name in named - {"migrations"}), (
        patterns
    )
    existing = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in {"tests", "bench", "scripts"}
    }
    # Alembic's scripts: shipped in the wheel, but no layer of code (nothing imports them)
    assert named == existing == FIRST_PARTY | {"migrations"}
    assert setuptools["py-modules"] == ["tiergate_cli"]
    assert (ROOT / "tiergate_cli.py").is_file()
    mypy = PYPROJECT["tool"]["mypy"]
    assert set(mypy["packages"]) == FIRST_PARTY and mypy["modules"] == ["tiergate_cli"]


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``uvicorn[standard]>=1``)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _group(name: str) -> list[str]:
    """A PEP 735 dependency group with its ``include-group`` entries expanded."""
    out: list[str] = []
    for entry in PYPROJECT["dependency-groups"][name]:
        out.extend(_group(entry["include-group"]) if isinstance(entry, dict) else [entry])
    return out


def test_the_light_installs_are_subsets_of_the_full_one() -> None:
    """``pip install tiergate`` stays the full gateway; the ``core`` and ``engine`` groups (for
    ``pip install --no-deps`` + ``pip install --group ...``) pin nothing it does not."""
    full = PYPROJECT["project"]["dependencies"]
    core, engine = _group("core"), _group("engine")
    assert set(core) <= set(engine) <= set(full)
    assert not {_name(r) for r in engine} & {_name(w) for w in WEB}


def test_the_engine_group_covers_what_the_core_and_the_plugins_import() -> None:
    distributions = importlib.metadata.packages_distributions()
    engine = {_name(r) for r in _group("engine")}
    needed: dict[str, str] = {}
    for package in ("priority", "engine_common", "engine_cuda", "engine_ascend"):
        for name, path in modules(package):
            for target in imported(name, path):
                top = target.partition(".")[0]
                if top in sys.stdlib_module_names or top in FIRST_PARTY or top in OPTIONAL:
                    continue
                for dist in distributions.get(top, [top]):
                    needed.setdefault(_name(dist), name)
    missing = {dist: module for dist, module in needed.items() if dist not in engine}
    assert missing == {}, f"add to [dependency-groups] (distribution: first importer): {missing}"
