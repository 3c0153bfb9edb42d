"""The model catalogue: preset arithmetic against published numbers, config parsing, errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from priority.models import (
    LLAMA2_70B,
    LLAMA31_8B,
    PRESETS,
    QWEN2_7B,
    QWEN3_32B,
    ModelShape,
    load_model_shape,
)
from priority.profiles import load_profile

PROFILE_DATA = Path(__file__).parents[1] / "priority" / "profiles" / "data"


def test_kv_bytes_per_token_is_k_and_v_of_every_layer_in_bf16() -> None:
    # Qwen2-7B: 2 (K, V) * 28 layers * 4 KV heads * 128 dims * 2 bytes.
    assert QWEN2_7B.kv_bytes_per_token(1) == 57_344
    # Qwen3-32B over TP4: 2 * 64 * 8 * 128 * 2 / 4; each device holds a quarter of the heads.
    assert QWEN3_32B.kv_bytes_per_token(4) == 65_536


@pytest.mark.parametrize(
    ("shape", "published"),
    [
        # Parameter totals of the models' safetensors checkpoints on Hugging Face.
        (QWEN2_7B, 7_615_616_512),
        (LLAMA31_8B, 8_030_261_248),
        (LLAMA2_70B, 68_976_648_192),
    ],
)
def test_params_match_the_published_checkpoints(shape: ModelShape, published: int) -> None:
    assert shape.params() == published
    assert shape.weight_bytes_per_device(1) == 2 * published
    assert shape.weight_bytes_per_device(4) == 2 * published // 4


@pytest.mark.parametrize("shape", list(PRESETS.values()), ids=list(PRESETS))
def test_linear_flops_are_two_per_projection_weight(shape: ModelShape) -> None:
    """Every projection / MLP weight is one MAC per token; norms, biases, embeddings are not."""
    bias = shape.q_dim + 2 * shape.kv_dim if shape.qkv_bias else 0
    gemm_weights = shape.layer_params() - bias - 2 * shape.hidden
    assert shape.linear_flops_per_token() == 2 * shape.layers * gemm_weights


def test_describe_is_what_the_shipped_profiles_record() -> None:
    """``describe`` feeds the profiles' provenance; RoPE / RMSNorm constants stay out of it."""
    recorded = {
        p.provenance["model_shape"]["name"]: p.provenance["model_shape"]
        for p in map(load_profile, sorted(PROFILE_DATA.glob("*.json")))
        if "model_shape" in p.provenance
    }
    assert recorded, "no shipped profile records a model shape"
    by_name = {s.name: s for s in PRESETS.values()}
    for name, shape in recorded.items():
        assert by_name[name].describe() == shape
    assert "rope_theta" not in QWEN2_7B.describe()


def test_from_hf_config_applies_the_transformers_defaults() -> None:
    cfg: dict[str, Any] = {
        "model_type": "qwen2",
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
        "rope_theta": 1e6,
        "rms_norm_eps": 1e-5,
    }
    shape = ModelShape.from_hf_config(cfg, name="small")
    assert shape == ModelShape(
        "small", 32, 3, 4, 2, 8, 64, 100, qkv_bias=True, rope_theta=1e6, rms_eps=1e-5
    )
    # No GQA key: one KV head per query head; a llama has no QKV bias unless it says so.
    llama = {**cfg, "model_type": "llama"}
    del llama["num_key_value_heads"], llama["rope_theta"]
    parsed = ModelShape.from_hf_config(llama)
    assert (parsed.kv_heads, parsed.qkv_bias, parsed.rope_theta) == (4, False, 10000.0)
    assert ModelShape.from_hf_config({**llama, "attention_bias": True}).qkv_bias
    # An explicit head_dim (Qwen3 style) wins over hidden / heads.
    assert ModelShape.from_hf_config({**cfg, "head_dim": 16}).head_dim == 16


def _as_hf(shape: ModelShape) -> dict[str, Any]:
    return {
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.q_heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.ffn,
        "vocab_size": shape.vocab,
        "attention_bias": shape.qkv_bias,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_eps,
    }


_DIM = st.integers(1, 1 << 16)


@given(
    hidden=_DIM,
    layers=_DIM,
    heads=st.tuples(_DIM, _DIM, _DIM),
    ffn=_DIM,
    vocab=_DIM,
    bias=st.booleans(),
    theta=st.floats(1.0, 1e7),
    eps=st.floats(1e-8, 1e-3),
)
def test_hf_config_round_trips(
    hidden: int,
    layers: int,
    heads: tuple[int, int, int],
    ffn: int,
    vocab: int,
    bias: bool,
    theta: float,
    eps: float,
) -> None:
    q_heads, kv_heads, head_dim = heads
    shape = ModelShape(
        "m",
        hidden,
        layers,
        q_heads,
        kv_heads,
        head_dim,
        ffn,
        vocab,
        qkv_bias=bias,
        rope_theta=theta,
        rms_eps=eps,
    )
    assert ModelShape.from_hf_config(_as_hf(shape), name="m") == shape


@pytest.mark.parametrize("shape", [QWEN2_7B, LLAMA31_8B], ids=lambda s: s.name)
def test_presets_parse_back_from_their_config_form(shape: ModelShape) -> None:
    parsed = ModelShape.from_hf_config(_as_hf(shape), name=shape.name)
    assert replace(parsed, source=shape.source) == shape


def test_load_model_shape_reads_presets_and_both_json_forms(tmp_path: Path) -> None:
    assert load_model_shape("qwen2-7b") is QWEN2_7B
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({**_as_hf(QWEN3_32B), "_name_or_path": "Qwen/Qwen3-32B"}))
    from_hf = load_model_shape(hf)
    assert from_hf == replace(QWEN3_32B, name="Qwen/Qwen3-32B", source="")
    own = tmp_path / "mine.json"
    own.write_text(
        json.dumps(
            {
                "hidden": 64,
                "layers": 1,
                "q_heads": 4,
                "kv_heads": 4,
                "head_dim": 16,
                "ffn": 128,
                "vocab": 50,
            }
        )
    )
    mine = load_model_shape(str(own))
    assert (mine.name, mine.layers, mine.kv_bytes_per_token(1)) == (str(own), 1, 2 * 4 * 16 * 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "not a preset"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"hidden_size": 8, "num_hidden_layers": 1}', "missing num_attention_heads"),
        ('{"hidden": 8, "colour": "red"}', "colour"),
    ],
)
def test_load_model_shape_errors_say_what_is_wrong(
    tmp_path: Path, text: str | None, message: str
) -> None:
    path = tmp_path / "config.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        load_model_shape(path)
    if text is None:
        assert all(key in str(err.value) for key in PRESETS)
