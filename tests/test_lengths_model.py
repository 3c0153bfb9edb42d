"""The length predictor: calibration on a known distribution, refinement, the overrun rule,
save/load with its manifest checks, hot swap, and the time budget's fallback."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from quantile_forest import RandomForestQuantileRegressor

from priority.lengths import DEFAULT_LEVELS, OVERRUN_GROWTH, LengthDistribution
from priority.lengths.features import FeatureConfig, Featurizer, RequestFeatures
from priority.lengths.forest import PackedForest
from priority.lengths.model import ForestParams, LengthPredictor, ModelFormatError
from priority.lengths.serving import PredictorHandle, apredict_with_budget, predict_with_budget
from priority.lengths.train import parse_row
from tests.featurizer_spy import record_hashed_prompts

TOPICS = ("haiku", "summary", "essay", "novel")
MU = {"haiku": 2.5, "summary": 3.5, "essay": 4.5, "novel": 5.5}
SIGMA = 0.5


def synthetic(n: int, seed: int) -> tuple[list[RequestFeatures], list[int]]:
    """Output length lognormal(MU[topic], SIGMA): the topic word in the prompt decides it."""
    rng = np.random.default_rng(seed)
    requests, lengths = [], []
    for _ in range(n):
        topic = TOPICS[int(rng.integers(len(TOPICS)))]
        filler = " ".join(rng.choice(["please", "now", "kindly", "the", "a"], size=3))
        requests.append(RequestFeatures(prompt=f"write a {topic} {filler}", model="m"))
        lengths.append(max(1, math.ceil(rng.lognormal(MU[topic], SIGMA))))
    return requests, lengths


@pytest.fixture(scope="module")
def predictor() -> LengthPredictor:
    requests, lengths = synthetic(3000, seed=1)
    return LengthPredictor.fit(
        requests, lengths, params=ForestParams(n_estimators=30), data_source="synthetic"
    )


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95])
def test_coverage_on_held_out_known_distribution(predictor: LengthPredictor, q: float) -> None:
    requests, lengths = synthetic(2000, seed=2)
    bounds = np.array([d.bound(q) for d in predictor.predict_many(requests)])
    coverage = float(np.mean(np.asarray(lengths) <= bounds))
    assert abs(coverage - q) <= 0.03, coverage


def test_coverage_holds_per_topic(predictor: LengthPredictor) -> None:
    """Conditional calibration: a single global quantile would cover nearly every haiku and
    few novels; the forest must cover ≈ q within each topic the prompt names."""
    requests, lengths = synthetic(2000, seed=5)
    bounds = [d.bound(0.9) for d in predictor.predict_many(requests)]
    for topic in TOPICS:
        hits = [
            y <= b
            for r, y, b in zip(requests, lengths, bounds, strict=True)
            if f" {topic} " in r.prompt
        ]
        assert abs(float(np.mean(hits)) - 0.9) <= 0.06, (topic, np.mean(hits))


def test_refinement_is_monotone_never_below_generated_and_matches_predict(
    predictor: LengthPredictor,
) -> None:
    request = RequestFeatures(prompt="write a essay please", model="m", max_tokens=None)
    for q in DEFAULT_LEVELS:  # with nothing generated, refine == the quantile vector's bound
        assert predictor.refine(request, 0, q) == predictor.predict(request).bound(q)
    previous = {q: 0 for q in (0.5, 0.9, 0.95)}
    for g in range(0, 1200, 7):
        bounds = [predictor.refine(request, g, q) for q in (0.5, 0.9, 0.95)]
        assert bounds == sorted(bounds)
        for q, b in zip((0.5, 0.9, 0.95), bounds, strict=True):
            assert b >= g + 1
            assert b >= previous[q]
            previous[q] = b


def test_a_request_is_featurized_once_per_layout(
    predictor: LengthPredictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = Featurizer.transform  # unwatched, for the expected rows
    hashed = record_hashed_prompts(monkeypatch)
    request = RequestFeatures(prompt="write a novel now please", model="m", max_tokens=900)
    first = predictor.predict(request)
    assert predictor.predict(request) == first
    predictor.refine(request, 10, 0.9)
    assert hashed == [request.prompt]  # one hashing for the prediction and its refinements
    # another featurizer of the same layout (the sample writer's) reuses that row as it is
    same = Featurizer(predictor.config).transform_once([request])
    assert hashed == [request.prompt]
    assert np.array_equal(same, plain(Featurizer(predictor.config), [request]))
    # one of another layout hashes the prompt for its own row
    other = Featurizer(FeatureConfig(word_dims=64, char_dims=64)).transform_once([request])
    assert hashed == [request.prompt, request.prompt] and other.shape[1] != same.shape[1]
    # the kept row is read-only and not part of the request's value
    with pytest.raises(ValueError):
        request._vectors[predictor.featurizer.layout][0] = 1.0
    fresh = RequestFeatures(prompt="write a novel now please", model="m", max_tokens=900)
    assert fresh == request and hash(fresh) == hash(request)


def test_overrun_rule(predictor: LengthPredictor) -> None:
    longest = int(predictor.leaves.y.max())
    g = longest + 10
    request = RequestFeatures(prompt="write a haiku", model="m")
    assert predictor.refine(request, g, 0.95) == g + math.ceil(OVERRUN_GROWTH * g)
    capped = RequestFeatures(prompt="write a haiku", model="m", max_tokens=g + 3)
    assert predictor.refine(capped, g, 0.95) == g + 3
    # the engines' rule on the sent distribution agrees
    assert predictor.predict(request).bound(0.95, g) == predictor.refine(request, g, 0.95)


def test_packed_trees_walk_like_scikit_learn() -> None:
    requests, lengths = synthetic(300, seed=3)
    x = Featurizer().transform(requests)
    forest = RandomForestQuantileRegressor(n_estimators=8, random_state=0).fit(x, lengths)
    packed = PackedForest.from_estimators(list(forest.estimators_))
    assert np.array_equal(packed.apply(x), forest.apply(x))


def test_save_load_round_trip_and_manifest_checks(
    predictor: LengthPredictor, tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    version = predictor.save(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["version"] == version and manifest["training_rows"] == 3000
    assert manifest["data_source"] == "synthetic" and manifest["features"]["word_dims"] == 128
    loaded = LengthPredictor.load(folder, expect_version=version)
    requests, _ = synthetic(50, seed=4)
    assert loaded.predict_many(requests) == predictor.predict_many(requests)

    with pytest.raises(ModelFormatError, match="expected"):
        LengthPredictor.load(folder, expect_version="other")
    manifest["format_version"] = 99
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFormatError, match="format"):
        LengthPredictor.load(folder)
    manifest["format_version"] = 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    LengthPredictor.load(folder)
    with (folder / "forest.npz").open("ab") as fh:
        fh.write(b"tampered")
    with pytest.raises(ModelFormatError, match="sha256"):
        LengthPredictor.load(folder)
    with pytest.raises(ModelFormatError):
        LengthPredictor.load(tmp_path / "missing")


class _Blocking:
    """A stand-in model whose prediction waits for the test to release it."""

    version = "blocking"

    def __init__(self) -> None:
        self.release = threading.Event()

    def predict(self, features: RequestFeatures) -> LengthDistribution:
        self.release.wait(10)
        return LengthDistribution.point(7)


class _Broken:
    version = "broken"

    def predict(self, features: RequestFeatures) -> LengthDistribution:
        raise RuntimeError("boom")


FALLBACK = LengthDistribution.point(512, max_tokens=512)
REQUEST = RequestFeatures(prompt="write a haiku", model="m", max_tokens=512)


def test_budget_returns_the_fallback_without_a_model_on_timeout_and_on_error(
    predictor: LengthPredictor,
) -> None:
    handle = PredictorHandle()
    assert predict_with_budget(handle, REQUEST, 1.0, FALLBACK) is FALLBACK
    blocking = _Blocking()
    handle.swap(blocking)  # type: ignore[arg-type]
    try:
        assert predict_with_budget(handle, REQUEST, 0.01, FALLBACK) is FALLBACK
    finally:
        blocking.release.set()
    handle.swap(_Broken())  # type: ignore[arg-type]
    assert predict_with_budget(handle, REQUEST, 1.0, FALLBACK) is FALLBACK
    old = handle.swap(predictor)
    assert isinstance(old, _Broken) and handle.version == predictor.version
    assert predict_with_budget(handle, REQUEST, 30.0, FALLBACK) == predictor.predict(REQUEST)


def test_async_budget_falls_back_on_timeout() -> None:
    blocking = _Blocking()
    handle = PredictorHandle(blocking)  # type: ignore[arg-type]

    async def main() -> LengthDistribution:
        return await apredict_with_budget(handle, REQUEST, 0.01, FALLBACK)

    try:
        assert asyncio.run(main()) is FALLBACK
    finally:
        blocking.release.set()


def test_handle_load_keeps_the_serving_model_on_a_bad_folder(
    predictor: LengthPredictor, tmp_path: Path
) -> None:
    handle = PredictorHandle(predictor)
    with pytest.raises(ModelFormatError):
        handle.load(tmp_path)
    assert handle.current is predictor
    predictor.save(tmp_path / "m")
    assert handle.load(tmp_path / "m") == predictor.version
    assert handle.current is not predictor


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {"prompt": "x", "model": "m"},
        {"prompt": 1, "model": "m", "output_tokens": 3},
        {"prompt": "x", "model": "", "output_tokens": 3},
        {"prompt": "x", "model": "m", "output_tokens": -1},
        {"prompt": "x", "model": "m", "output_tokens": True},
        {"prompt": "x", "model": "m", "output_tokens": 3, "max_tokens": 0},
        {"prompt": "x", "model": "m", "output_tokens": 3, "tenant": 5},
    ],
)
def test_bad_rows_are_rejected_with_their_place(obj: object) -> None:
    with pytest.raises(ValueError, match="line 7"):
        parse_row(obj, "line 7")
