"""engine_cuda.profile_batches on CPU with a tiny config: CSV format and fit round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from priority.models import TINY, load_model_shape
from priority.profiles import load_profile
from priority.profiles.fit import fit_profile
from priority.profiles.table import COLUMNS, read_rows

torch = pytest.importorskip("torch")

from engine_common.profiling import _length_buckets  # noqa: E402
from engine_cuda import profile_batches as pb  # noqa: E402


def test_cli_writes_a_fittable_profile_table(tmp_path: Path) -> None:
    out = tmp_path / "tiny.csv"
    pb.main(
        [
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--grid",
            "small",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "-o",
            str(out),
        ]
    )
    header = out.read_text().splitlines()[0].split(",")
    assert tuple(header[:4]) == COLUMNS
    rows = read_rows(out)
    grid = pb.batch_grid("small")
    assert [(r.prefill, r.decode_kv) for r in rows] == grid
    assert all(r.latency_s > 0 for r in rows)
    assert all(r.meta["device"] == "cpu" and r.meta["dtype"] == "float32" for r in rows)
    # The grid covers pure prefill over a cached prefix, pure decode and mixed batches.
    assert any(r.prefill and r.prefill[0][1] > 0 and not r.decode_kv for r in rows)
    assert any(r.decode_kv and not r.prefill for r in rows)
    assert any(r.decode_kv and r.prefill for r in rows)

    profile = fit_profile(rows, name="tiny-cpu", hardware="cpu", model="tiny")
    assert profile.fit["rows"] == len(rows)
    assert profile.estimator().batch_time(decode_kv=[64]) > 0
    profile.save(tmp_path / "tiny.json")
    assert load_profile(tmp_path / "tiny.json").coefficients == profile.coefficients


def test_config_from_hf_json(tmp_path: Path) -> None:
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 100,
        "rope_theta": 1e6,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    parsed = load_model_shape(path)
    assert (parsed.head_dim, parsed.kv_heads, parsed.qkv_bias) == (8, 2, True)
    rows = pb.profile(
        parsed, [(((8, 4),), (3, 5))], device="cpu", dtype="float32", warmup=0, repeats=1
    )
    assert len(rows) == 1 and rows[0].latency_s > 0


def test_prefix_mask_is_offset_causal() -> None:
    model = pb.Decoder(TINY, "cpu", torch.float32)
    inp = model.prepare((((2, 3), (4, 0)), (1, 6)))
    mask = inp["masks"][0]
    # Query i of a 2-token chunk after 3 cached tokens sees keys 0..3+i.
    assert mask.tolist() == [[True] * 4 + [False], [True] * 5]
    assert inp["masks"][1] is None  # fresh prompt: plain causal
    # Decodes of 1 and 6 cached tokens fall in different length buckets (2 and 7 keys), so
    # the short one pads to 2 keys, not to the long one's 7.
    (a0, b0, len0, mask0), (a1, b1, len1, mask1) = inp["dec_groups"]
    assert (a0, b0, len0, a1, b1, len1) == (0, 1, 2, 1, 2, 7)
    assert mask0[0, 0, 0].tolist() == [True, True]
    assert mask1[0, 0, 0].tolist() == [True] * 7
    logits = model.forward(inp)
    assert logits.shape == (4, TINY.vocab)
    assert torch.isfinite(logits).all()


def test_cli_rejects_an_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a preset"):
        pb.main(["--model", "no-such-model", "--device", "cpu", "-o", str(tmp_path / "x.csv")])
    assert not (tmp_path / "x.csv").exists()


def test_decode_buckets_bound_padding_waste() -> None:
    lengths = sorted([16, 17, 40, 100, 127, 128, 1000, 4000, 4095])
    runs = _length_buckets(lengths)
    assert [i for run in runs for i in range(*run)] == list(range(len(lengths)))
    for start, stop in runs:
        padded = (stop - start) * (lengths[stop - 1] + 1)
        assert padded < 2 * sum(n + 1 for n in lengths[start:stop])


def test_random_grid_is_seeded_and_within_the_engine_limits() -> None:
    grid = pb.batch_grid("random", count=40, seed=3)
    assert grid == pb.batch_grid("random", count=40, seed=3)
    assert grid != pb.batch_grid("random", count=40, seed=4)
    assert len(grid) == 40
    for prefill, decode in grid:
        assert prefill or decode
        assert sum(q for q, _ in prefill) + len(decode) <= 8192
        assert len(prefill) + len(decode) <= 256
    # Mixed steps (prefill chunks beside decodes) and prefixes both occur.
    assert any(p and d for p, d in grid)
    assert any(kv > 0 for p, _ in grid for _, kv in p)
