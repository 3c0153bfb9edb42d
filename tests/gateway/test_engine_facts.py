"""What an engine says it is, read from its ``/metrics`` (the parts that need no engine)."""

from __future__ import annotations

from gateway.app.engine_facts import (
    EngineFacts,
    effective_engine,
    parse_engine_facts,
    parse_labels,
)
from priority.estimator import LatencyCoefficients
from priority.profiles import EngineConfig

# ruff: noqa: E501 (metrics lines are as long as the engine writes them)
# Lines as vLLM 0.32's CPU build and the plugin's stat logger write them (trimmed).
PLUGIN = """\
# HELP tiergate:engine_config_info The engine's own configuration (seats, limits, policy), as labels.
# TYPE tiergate:engine_config_info gauge
tiergate:engine_config_info{block_size="128",engine="0",max_model_len="2048",max_num_batched_tokens="2048",max_num_seqs="16",num_kv_blocks="8192",policy="slide",profile="",scheduler="engine_cuda.scheduler.TiergateScheduler"} 1.0
tiergate:estimator_beta{engine="0"} 1.25
tiergate:estimator_coefficient{engine="0",name="a_p"} 1e-09
tiergate:estimator_coefficient{engine="0",name="b_p"} 2e-09
tiergate:estimator_coefficient{engine="0",name="c_p"} 3e-05
tiergate:estimator_coefficient{engine="0",name="a_d"} 4e-08
tiergate:estimator_coefficient{engine="0",name="b_d"} 5e-05
tiergate:estimator_coefficient{engine="0",name="t_c"} 0.002
tiergate:estimator_coefficient{engine="0",name="d_p"} 0.0
"""
STOCK = """\
vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",engine="0",kv_cache_dtype_skip_layers="[]",num_gpu_blocks="900",num_gpu_blocks_override="None"} 1.0
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
"""


def test_the_plugins_facts() -> None:
    facts = parse_engine_facts(PLUGIN)
    assert facts.max_num_seqs == 16
    assert facts.max_num_batched_tokens == 2048
    assert facts.block_size == 128 and facts.num_kv_blocks == 8192
    assert facts.max_model_len == 2048
    assert facts.policy == "slide"
    assert facts.beta == 1.25
    assert facts.coefficients == LatencyCoefficients(1e-9, 2e-9, 3e-5, 4e-8, 5e-5, 0.002, 0.0)


def test_stock_vllm_states_its_kv_cache_only() -> None:
    facts = parse_engine_facts(STOCK)
    assert facts.block_size == 128 and facts.num_kv_blocks == 900
    assert facts.max_num_seqs is None and facts.coefficients is None and facts.policy is None


def test_an_incomplete_or_invalid_estimator_is_not_taken() -> None:
    partial = "\n".join(x for x in PLUGIN.splitlines() if 'name="t_c"' not in x)
    assert parse_engine_facts(partial).coefficients is None
    negative = PLUGIN.replace('name="a_p"} 1e-09', 'name="a_p"} -1')
    assert parse_engine_facts(negative).coefficients is None
    assert parse_engine_facts(PLUGIN.replace("} 1.25", "} nan")).beta is None


def test_the_engine_wins_and_every_disagreement_is_named() -> None:
    configured = EngineConfig(block_size=16, num_kv_blocks=8192, max_num_seqs=256)
    engine, mismatches = effective_engine(configured, parse_engine_facts(PLUGIN))
    assert engine.max_num_seqs == 16 and engine.block_size == 128
    assert engine.max_num_batched_tokens == 2048
    assert sorted(mismatches) == [
        "block_size",
        "max_num_batched_tokens",
        "max_num_seqs",
    ]
    same, none = effective_engine(engine, parse_engine_facts(PLUGIN))
    assert same == engine and none == {}
    assert effective_engine(configured, EngineFacts()) == (configured, {})


def test_labels_with_quotes_and_escapes() -> None:
    labels = parse_labels('{a="x,y",b="say \\"hi\\"",c="1"} 1.0')
    assert labels == {"a": "x,y", "b": 'say "hi"', "c": "1"}
