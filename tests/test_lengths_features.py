"""The featurizer's text bound: a long prompt's n-grams see only its head and tail, its counts
see all of it, and a layout from before the bound (no ``max_text_chars``) hashes everything."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from sklearn.feature_extraction.text import HashingVectorizer

from priority.lengths.features import (
    QUESTIONS_CAP,
    FeatureConfig,
    Featurizer,
    RequestFeatures,
    _count_upto,
)
from priority.lengths.model import MANIFEST, ForestParams, LengthPredictor

WORDS = ("alpha", "beta", "gamma", "delta", "what?", "line\n", "epsilon", "zeta")


def text(chars: int, seed: int) -> str:
    """Word soup of exactly ``chars`` characters, with newlines and question marks."""
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=chars // 4 + 1)
    return " ".join(str(w) for w in words)[:chars]


def old_layout_json() -> dict[str, object]:
    """A manifest's ``features`` as written before ``max_text_chars`` existed."""
    data = FeatureConfig().to_json()
    del data["max_text_chars"]
    return data


def hashed_columns(config: FeatureConfig, prompt: str) -> np.ndarray:
    """The word and char n-gram columns of ``prompt``, hashed whole by the vectorizers' own
    settings (the layout's definition, independent of the featurizer's text bound)."""
    words = HashingVectorizer(
        n_features=config.word_dims,
        ngram_range=config.word_ngrams,
        alternate_sign=False,
        norm="l2",
    )
    chars = HashingVectorizer(
        n_features=config.char_dims,
        analyzer="char_wb",
        ngram_range=config.char_ngrams,
        alternate_sign=False,
        norm="l2",
    )
    return np.hstack(
        [words.transform([prompt]).toarray(), chars.transform([prompt]).toarray()]
    ).astype(np.float32)[0]


def test_a_huge_prompt_hashes_only_its_head_and_tail() -> None:
    config = FeatureConfig()
    limit = config.max_text_chars
    assert limit is not None  # new layouts are bounded
    prompt = text(2_000_000, seed=0)
    head, tail = prompt[: limit // 2], prompt[-(limit - limit // 2) :]
    assert config.hashed_text(prompt) == head + " " + tail
    row = Featurizer(config).transform([RequestFeatures(prompt=prompt, model="m")])[0]
    hashed = config.word_dims + config.char_dims
    np.testing.assert_array_equal(row[:hashed], hashed_columns(config, head + " " + tail))
    assert not np.array_equal(row[:hashed], hashed_columns(config, prompt[:limit]))
    # the counts still see the whole prompt
    numeric = dict(zip(config.NUMERIC, row[hashed : hashed + len(config.NUMERIC)], strict=True))
    assert numeric["log_chars"] == pytest.approx(math.log1p(len(prompt)))
    assert numeric["log_lines"] == pytest.approx(math.log1p(prompt.count("\n")))
    assert numeric["log_prompt_tokens"] == pytest.approx(math.log1p(len(prompt) / 4), rel=1e-6)


def test_the_middle_of_a_long_prompt_changes_no_column() -> None:
    config = FeatureConfig()
    limit = config.max_text_chars
    assert limit is not None
    prompt = text(50_000, seed=1)
    # other words in the middle, same length, same newlines and question marks
    middle = slice(limit, len(prompt) - limit)
    swapped = prompt[middle].replace("alpha", "omega").replace("beta", "iota")
    assert swapped != prompt[middle]
    other = prompt[: middle.start] + swapped + prompt[middle.stop :]
    featurizer = Featurizer(config)
    a, b = featurizer.transform(
        [RequestFeatures(prompt=p, model="m", max_tokens=64) for p in (prompt, other)]
    )
    np.testing.assert_array_equal(a, b)
    # the unbounded layout sees the middle
    whole = Featurizer(FeatureConfig(max_text_chars=None))
    a, b = whole.transform([RequestFeatures(prompt=p, model="m") for p in (prompt, other)])
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("chars", [0, 1, 100])
def test_a_prompt_within_the_bound_featurizes_as_before(chars: int) -> None:
    prompt = text(chars, seed=2)
    bounded = Featurizer(FeatureConfig(max_text_chars=100))
    whole = Featurizer(FeatureConfig(max_text_chars=None))
    request = RequestFeatures(prompt=prompt, model="m", tenant="t", max_tokens=9)
    np.testing.assert_array_equal(bounded.transform([request]), whole.transform([request]))


def test_an_odd_bound_keeps_exactly_that_many_characters() -> None:
    config = FeatureConfig(max_text_chars=5)
    assert config.hashed_text("abcdefghij") == "ab hij"
    assert config.hashed_text("abcde") == "abcde"
    with pytest.raises(ValueError, match="max_text_chars"):
        FeatureConfig(max_text_chars=1)


def test_an_old_layout_loads_unbounded_with_its_id_and_rows() -> None:
    old = old_layout_json()
    config = FeatureConfig.from_json(old)
    assert config.max_text_chars is None
    # the id under which an older gateway stored its samples, and the json it came from
    assert config.to_json() == old
    digest = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    assert config.layout_id() == digest != FeatureConfig().layout_id()
    prompt = text(20_000, seed=3)
    row = Featurizer(config).transform([RequestFeatures(prompt=prompt, model="m")])[0]
    hashed = config.word_dims + config.char_dims
    np.testing.assert_array_equal(row[:hashed], hashed_columns(config, prompt))


def test_the_bound_round_trips_through_json() -> None:
    config = FeatureConfig(max_text_chars=1000)
    assert FeatureConfig.from_json(config.to_json()) == config
    assert config.layout_id() != FeatureConfig(max_text_chars=2000).layout_id()


def test_a_model_saved_before_the_bound_still_hashes_whole_prompts(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    requests = [
        RequestFeatures(prompt=text(int(rng.integers(10, 12_000)), seed=i), model="m")
        for i in range(200)
    ]
    lengths = [max(1, len(r.prompt) // 100) for r in requests]
    fitted = LengthPredictor.fit(requests, lengths, params=ForestParams(n_estimators=5))
    assert fitted.config.max_text_chars is not None
    fitted.save(tmp_path)
    # a manifest as written before the field existed (the sha256 covers only the arrays)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    del manifest["features"]["max_text_chars"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    loaded = LengthPredictor.load(tmp_path)
    assert loaded.config.max_text_chars is None
    long = RequestFeatures(prompt=text(30_000, seed=5), model="m")
    whole = Featurizer(FeatureConfig(max_text_chars=None)).transform([long])
    np.testing.assert_array_equal(loaded.featurizer.transform([long]), whole)


@pytest.mark.parametrize("questions", [0, 1, QUESTIONS_CAP - 1, QUESTIONS_CAP, 40])
def test_the_question_count_stops_at_its_cap(questions: int) -> None:
    prompt = "is it? " * questions + "no question here"
    assert _count_upto(prompt, "?", QUESTIONS_CAP) == min(prompt.count("?"), QUESTIONS_CAP)


def test_evaluation_times_each_call_with_its_featurization() -> None:
    """Scoring the same rows at a second q must not reuse the rows the first q kept on the
    requests (it would time the tree walk alone)."""
    from priority.lengths.evaluate import evaluate
    from priority.lengths.train import LengthRow

    requests = [RequestFeatures(prompt=text(200, seed=i), model="m") for i in range(50)]
    predictor = LengthPredictor.fit(requests, [5] * 50, params=ForestParams(n_estimators=3))
    rows = [LengthRow(features=r, output_tokens=5) for r in requests]
    kept: list[int] = []

    def bounder(features: RequestFeatures) -> int:
        kept.append(len(features._vectors))
        return predictor.predict(features).bound(0.9)

    for q in (0.5, 0.9):
        assert evaluate(bounder, rows, q).rows == len(rows)
    assert kept == [0] * (2 * len(rows))
