"""The ``tiergate sim`` contract other tools depend on: flags, JSON schema, errors; and the
``tiergate`` script's assembly: the core's CLI (``python -m priority.cli``) mounted with the
gateway's commands, every sub-command where it was."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import tiergate_cli
from priority.cli import app

RESULT_KEYS = {
    "policy",
    "router",
    "tdg_ratio",
    "slo_attainment",
    "goodput_tokens",
    "goodput_requests",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "submitted",
    "finished",
    "per_tier",
}
TIER_KEYS = {"weight", "tdg_ratio", "slo_attainment", "submitted"}
BASE = [
    "sim",
    "--trace",
    "azure_conv_20min",
    "--profile",
    "a100-qwen2-7b,910b-qwen2-7b",
    "--instances",
    "2",
    "--router",
    "goroute",
    "--duration",
    "15",
    "--seed",
    "3",
]
runner = CliRunner()


def plain(output: str) -> str:
    """CLI output without rich's panel borders and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


def run_json(tmp_path: Path, *extra: str) -> list[dict[str, object]]:
    out = tmp_path / "out.json"
    result = runner.invoke(app, [*BASE, *extra, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["results"]


def test_json_schema_and_shared_workload(tmp_path: Path) -> None:
    results = run_json(tmp_path, "--policy", "vllm-v0-fcfs,slide", "--rate-scale", "1.5")
    assert [r["policy"] for r in results] == ["vllm-v0-fcfs", "slide"]
    for r in results:
        assert set(r) >= RESULT_KEYS
        assert r["router"] == "goroute"
        assert 0.0 <= r["tdg_ratio"] <= 1.0 and 0.0 <= r["slo_attainment"] <= 1.0
        assert set(r["per_tier"]) == {"high", "low"}
        for tier in r["per_tier"].values():
            assert set(tier) >= TIER_KEYS
        assert r["per_tier"]["high"]["weight"] == 2.0 and r["per_tier"]["low"]["weight"] == 1.0
        assert sum(t["submitted"] for t in r["per_tier"].values()) == r["submitted"]
    # every policy in one run replays the identical workload
    assert results[0]["submitted"] == results[1]["submitted"]
    assert (
        results[0]["per_tier"]["high"]["submitted"] == results[1]["per_tier"]["high"]["submitted"]
    )


def test_seed_reproduces_and_load_sweep(tmp_path: Path) -> None:
    first = run_json(tmp_path, "--policy", "sarathi-priority", "--rps", "4,8")
    again = run_json(tmp_path, "--policy", "sarathi-priority", "--rps", "4,8")
    strip = [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in first]
    assert strip == [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in again]
    assert [r["rps"] for r in first] == [4.0, 8.0]
    assert first[1]["submitted"] > first[0]["submitted"]


def test_plot_is_written(tmp_path: Path) -> None:
    png = tmp_path / "gain.png"
    result = runner.invoke(
        app, [*BASE, "--policy", "slide", "--rate-scale", "0.5,1", "--plot", str(png)]
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope", "--rate-scale", "1"], "unknown policy 'nope'"),
        (["--policy", "slide", "--router", "x", "--rate-scale", "1"], "unknown router 'x'"),
        (["--policy", "slide"], "exactly one of --rate-scale or --rps"),
        (["--policy", "slide", "--rate-scale", "1", "--rps", "2"], "exactly one"),
        (["--policy", "slide", "--rate-scale", "-1"], "must be > 0"),
        (["--policy", "slide", "--rate-scale", "abc"], "comma-separated numbers"),
        (["--policy", "slide", "--rate-scale", "1", "--pd-prefill", "2"], "decode instance"),
    ],
)
def test_bad_input_gets_a_clear_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, [*BASE, *args])
    assert result.exit_code == 2
    assert message in plain(result.output)


def test_unknown_profile_and_trace() -> None:
    result = runner.invoke(
        app, ["sim", "--trace", "azure_conv_20min", "--profile", "tpu-x", "--rate-scale", "1"]
    )
    assert result.exit_code == 2 and "unknown profile 'tpu-x'" in plain(result.output)
    result = runner.invoke(
        app, ["sim", "--trace", "/nonexistent.csv", "--profile", "a100-qwen2-7b", "--rps", "1"]
    )
    assert result.exit_code == 2 and "does not exist" in plain(result.output)


def commands(typer_app: typer.Typer) -> set[str]:
    group = typer.main.get_command(typer_app)
    assert isinstance(group, typer.core.TyperGroup)
    return set(group.commands)


def test_tiergate_mounts_the_core_and_the_gateway_commands() -> None:
    core = {"sim", "profile", "lengths"}
    assert commands(app) == core  # the core's CLI: no web stack behind it
    gateway = {"serve", "engine-sim", "usage"}
    groups = {"db", "tiers", "tenants", "keys", "backends", "profiles", "admin", "operators"}
    groups |= {"prices", "budgets"}
    assert commands(tiergate_cli.app) == core | gateway | groups


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sim", "--trace", "azure_conv_20min", "--profile", "tpu-x", "--rps", "1"], "tpu-x"),
        (["serve", "--policy", "nope"], "unknown policy 'nope'"),
        (["engine-sim", "--profile", "a100-qwen2-7b", "--policy", "nope"], "unknown policy"),
        (["profile", "fit", "/nonexistent.csv", "-o", "x.json"], "does not exist"),
        (["lengths", "train", "--data", "/nonexistent.jsonl", "--out", "x"], "does not exist"),
    ],
)
def test_tiergate_commands_take_their_arguments(args: list[str], message: str) -> None:
    """Each command is reached through ``tiergate`` and parses its options (refused before any
    server or database starts)."""
    result = runner.invoke(tiergate_cli.app, args)
    assert result.exit_code == 2 and message in plain(result.output), result.output


def _commands(command: object, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """Every leaf command of the ``tiergate`` tree, with its path (typer bundles its own click:
    read by duck typing)."""
    children = getattr(command, "commands", None)
    if not children:
        return [(path, command)]
    found: list[tuple[tuple[str, ...], object]] = []
    for name, child in children.items():
        found += _commands(child, (*path, name))
    return found


def test_help_at_80_columns_shows_every_option_name_whole() -> None:
    """An 80-column terminal (the default of many) sees each option's full name, never cut to
    ``--min-deadline-…``."""
    runner = CliRunner()
    commands = _commands(typer.main.get_command(tiergate_cli.app))
    assert len(commands) > 20
    cut = {}
    for path, command in commands:
        names = {
            opt
            for param in getattr(command, "params", [])
            if getattr(param, "param_type_name", "") == "option"
            for opt in (*param.opts, *param.secondary_opts)
            if opt.startswith("--") and opt != "--help"
        }
        result = runner.invoke(tiergate_cli.app, [*path, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, (path, result.output)
        shown = set(re.findall(r"--[\w-]+", result.output))
        if names - shown:
            cut[" ".join(path)] = sorted(names - shown)
    assert cut == {}
