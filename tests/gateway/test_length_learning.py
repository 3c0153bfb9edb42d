"""The gateway learns its length model from its own traffic (TIERGATE_LENGTHS_LEARN).

Samples are stored as hashed features without the prompt's text (unless the operator turns
prompt storage on), censored samples are marked, the periodic trainer trains after enough
samples and the served version changes, a failed training leaves the old model serving, and one
trainer runs at a time (advisory lock on PostgreSQL, a file lock elsewhere). Forests are tiny
and workloads synthetic, so each training takes well under a second.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.app import length_learning
from gateway.app.length_learning import LengthLearner, TrainingLock
from gateway.app.metrics import GatewayMetrics
from gateway.db.length_samples import SampleWriter, finish_of, load_samples, prune
from gateway.db.models import LengthSample
from gateway.length_models import versions
from priority.lengths.features import FeatureConfig, Featurizer, RequestFeatures
from priority.lengths.model import ForestParams, LengthPredictor
from priority.lengths.serving import PredictorHandle
from tests.featurizer_spy import record_hashed_prompts

SECRET_WORDS = ("zebracorn", "marmaladequest", "quixotically")
KEY = b"k" * 32
TINY = ForestParams(n_estimators=4, min_samples_leaf=2)


def _request(i: int, *, max_tokens: int | None = 400) -> RequestFeatures:
    """Two kinds of prompt with very different answer lengths (a learnable workload)."""
    long = i % 2 == 0
    prompt = ("write an essay about " if long else "say yes to ") + " ".join(SECRET_WORDS)
    return RequestFeatures(
        prompt=f"{prompt} #{i}", model="m1", max_tokens=max_tokens, tenant=f"tenant-{i % 3}"
    )


def _length(i: int) -> int:
    return 300 if i % 2 == 0 else 5


def _writer(factory: sessionmaker[Session], **kwargs: Any) -> SampleWriter:
    return SampleWriter(factory, tenant_key=KEY, flush_interval_s=0.05, **kwargs)


def _fill(factory: sessionmaker[Session], count: int, start: int = 0, **kwargs: Any) -> None:
    writer = _writer(factory, **kwargs)
    try:
        for i in range(start, start + count):
            writer.submit(_request(i), _length(i))
        assert writer.flush(timeout=30)
        assert writer.written == count and writer.dropped == 0
    finally:
        writer.close()


def _rows(factory: sessionmaker[Session]) -> list[LengthSample]:
    with factory() as session:
        return list(session.scalars(select(LengthSample).order_by(LengthSample.id)))


def test_a_sample_stores_hashed_features_and_never_the_prompt_text(
    session_factory: sessionmaker[Session],
) -> None:
    _fill(session_factory, 4)
    rows = _rows(session_factory)
    assert len(rows) == 4
    width = FeatureConfig().width
    for row in rows:
        assert row.prompt is None
        assert len(row.features) == width * 4
        assert row.layout == FeatureConfig().layout_id()
        assert row.tenant_hash is not None and "tenant" not in row.tenant_hash
        stored = repr([getattr(row, c.key) for c in LengthSample.__table__.columns]).lower()
        for word in SECRET_WORDS:
            assert word not in stored
            assert word.encode() not in row.features
    assert [r.output_tokens for r in rows] == [300, 5, 300, 5]


def test_a_predicted_request_is_stored_with_the_row_its_prediction_hashed(
    session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    predictor = LengthPredictor.fit([_request(i) for i in range(8)], [_length(i) for i in range(8)])
    plain = Featurizer.transform  # unwatched, for the expected rows
    hashed = record_hashed_prompts(monkeypatch)
    predicted, unpredicted = _request(100), _request(101)
    predictor.predict(predicted)  # the gateway's prediction, at admission
    writer = _writer(session_factory)
    try:
        writer.submit(predicted, 300)
        writer.submit(unpredicted, 5)  # no model loaded for this one: the writer hashes it
        assert writer.flush(timeout=30) and writer.written == 2
    finally:
        writer.close()
    assert hashed == [predicted.prompt, unpredicted.prompt]
    rows = _rows(session_factory)
    expected = plain(Featurizer(), [predicted, unpredicted])
    assert [bytes(r.features) for r in rows] == [row.tobytes() for row in expected]


def test_prompt_text_is_stored_only_when_the_operator_turns_it_on(
    session_factory: sessionmaker[Session],
) -> None:
    _fill(session_factory, 2, store_prompts=True)
    rows = _rows(session_factory)
    assert all(r.prompt is not None and SECRET_WORDS[0] in r.prompt for r in rows)


def test_an_answer_stopped_at_max_tokens_is_a_censored_sample(
    session_factory: sessionmaker[Session],
) -> None:
    assert finish_of(_request(0, max_tokens=10), 10) == "length"
    assert finish_of(_request(0, max_tokens=10), 9) == "stop"
    assert finish_of(_request(0, max_tokens=None), 10_000) == "stop"
    writer = _writer(session_factory)
    try:
        writer.submit(_request(0, max_tokens=10), 10)
        writer.submit(_request(1, max_tokens=10), 4)
        assert writer.flush(timeout=30)
    finally:
        writer.close()
    assert [r.finish for r in _rows(session_factory)] == ["length", "stop"]
    kept = load_samples(session_factory, FeatureConfig(), limit=10)
    assert sorted(kept.y.tolist()) == [4.0, 10.0] and kept.censored == 1  # kept at the cap
    stop_only = load_samples(session_factory, FeatureConfig(), limit=10, censored=False)
    assert stop_only.y.tolist() == [4.0] and stop_only.censored == 0


def test_retention_keeps_the_newest_rows(session_factory: sessionmaker[Session]) -> None:
    _fill(session_factory, 12)
    assert prune(session_factory, 5) == 7
    rows = _rows(session_factory)
    assert len(rows) == 5
    assert [r.output_tokens for r in rows] == [_length(i) for i in range(7, 12)]


def test_the_writer_prunes_to_its_row_cap_as_it_writes(
    session_factory: sessionmaker[Session],
) -> None:
    _fill(session_factory, 30, max_rows=10)  # prunes every max(1, 5% of 10) rows written
    assert len(_rows(session_factory)) == 10


def test_a_full_queue_drops_samples_and_counts_them(
    session_factory: sessionmaker[Session],
) -> None:
    writer = SampleWriter(session_factory, tenant_key=KEY, queue_limit=2, flush_interval_s=60)
    try:
        for i in range(5):
            writer.submit(_request(i), 5)
        assert writer.dropped == 3
        assert writer.flush(timeout=30)
        assert writer.written == 2
    finally:
        writer.close()


def _learner(
    factory: sessionmaker[Session], engine: Engine, root: Path, **kwargs: Any
) -> LengthLearner:
    options: dict[str, Any] = {
        "handle": PredictorHandle(),
        "samples": None,
        "metrics": GatewayMetrics(),
        "factory": factory,
        "database_url": engine.url.render_as_string(hide_password=False),
        "root": root,
        "interval_s": 1e-9,  # every check is due: a fresh version each call
        "min_samples": 20,
        "max_rows": 10_000,
        "keep": 2,
        "params": TINY,
        "in_process": True,
    }
    options.update(kwargs)
    return LengthLearner(**options)


def _metric(learner: LengthLearner, outcome: str) -> float:
    value = learner.metrics.length_trainings.labels(outcome)._value.get()
    return float(value)


def test_the_trainer_waits_for_enough_samples_then_serves_each_new_version(
    session_factory: sessionmaker[Session], db_engine: Engine, tmp_path: Path
) -> None:
    learner = _learner(session_factory, db_engine, tmp_path / "lengths")
    _fill(session_factory, 10)
    assert asyncio.run(learner.train()) == "skipped"
    assert learner.handle.current is None and versions(learner.root) == []
    _fill(session_factory, 30, start=10)
    assert asyncio.run(learner.train()) == "ok"
    first = learner.handle.version
    assert first is not None
    predictor = learner.handle.current
    assert predictor is not None
    long, short = (predictor.predict(_request(i)).bound(0.5) for i in (100, 101))
    assert long > 3 * short  # it learned the workload from hashed features alone
    _fill(session_factory, 10, start=40)  # new traffic: a different model
    assert asyncio.run(learner.train()) == "ok"
    assert learner.handle.version not in (None, first)
    assert asyncio.run(learner.train()) == "ok"
    assert len(versions(learner.root)) == 2  # keep=2: the oldest is deleted
    assert _metric(learner, "ok") == 3 and _metric(learner, "skipped") == 1


def test_a_failed_training_leaves_the_served_model(
    session_factory: sessionmaker[Session],
    db_engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    learner = _learner(session_factory, db_engine, tmp_path / "lengths")
    _fill(session_factory, 30)
    assert asyncio.run(learner.train()) == "ok"
    served = learner.handle.version

    def broken(*args: Any, **kwargs: Any) -> None:
        raise MemoryError("the forest did not fit")

    monkeypatch.setattr(length_learning, "train_and_publish", broken)
    assert asyncio.run(learner.train()) == "failed"
    assert learner.handle.version == served
    assert _metric(learner, "failed") == 1
    assert len(versions(learner.root)) == 1


def test_another_worker_picks_the_new_version_up(
    session_factory: sessionmaker[Session], db_engine: Engine, tmp_path: Path
) -> None:
    trainer = _learner(session_factory, db_engine, tmp_path / "lengths")
    other = _learner(session_factory, db_engine, tmp_path / "lengths")
    _fill(session_factory, 30)
    assert asyncio.run(trainer.train()) == "ok"
    assert other.handle.current is None
    assert asyncio.run(other.poll()) is True
    assert other.handle.version == trainer.handle.version
    assert asyncio.run(other.poll()) is False  # nothing newer


def test_one_trainer_at_a_time(session_factory: sessionmaker[Session], tmp_path: Path) -> None:
    first = TrainingLock(session_factory, tmp_path)
    second = TrainingLock(session_factory, tmp_path)
    assert first.acquire()
    try:
        assert not second.acquire()
    finally:
        first.release()
    assert second.acquire()
    second.release()


def test_a_worker_that_waited_for_the_lock_does_not_train_again(
    session_factory: sessionmaker[Session], db_engine: Engine, tmp_path: Path
) -> None:
    learner = _learner(session_factory, db_engine, tmp_path / "lengths", interval_s=3600)
    _fill(session_factory, 30)
    assert asyncio.run(learner.train()) == "ok"
    assert asyncio.run(learner.train()) == "idle"  # the newest version is fresh
    assert len(versions(learner.root)) == 1


@pytest.mark.slow
def test_the_forest_grows_in_a_child_process(sqlite_url: str, tmp_path: Path) -> None:
    from gateway.db.models import Base
    from gateway.db.session import make_engine, make_session_factory

    engine = make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    try:
        _fill(factory, 30)
        learner = _learner(factory, engine, tmp_path / "lengths", in_process=False)
        assert asyncio.run(learner.train()) == "ok"
        assert learner.handle.version is not None
        with factory() as session:
            assert session.scalar(select(func.count()).select_from(LengthSample)) == 30
    finally:
        engine.dispose()


def test_the_gateway_records_one_sample_per_finished_request(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient
    from seeded_app import app_settings, seed_database

    from engine_emulated import EngineSpec, EngineThread
    from gateway.app import BackendSpec, create_app
    from gateway.db.session import make_session_factory

    model = "qwen2-7b"
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine, key = seed_database(url, "learn-secret")
    settings = app_settings(
        url, tmp_path, "learn-secret", "learn-admin", lengths_learn=True, length_budget_ms=1000.0
    )
    prompt = "Tell me about " + " ".join(SECRET_WORDS)
    try:
        with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", model)]) as engines:
            backends = [BackendSpec("engine-0", engines[0].url, model, engines[0].spec.profile)]
            app = create_app(settings, backends=backends)
            with TestClient(app) as client:
                headers = {"authorization": f"Bearer {key}"}
                for path, body, status in (
                    ("chat/completions", {"messages": [{"role": "user", "content": prompt}]}, 200),
                    ("completions", {"prompt": prompt, "stream": True}, 200),
                    ("completions", {"prompt": [prompt, prompt]}, 400),  # the engine refuses
                ):
                    answer = client.post(
                        f"/v1/{path}",
                        json={"model": model, "max_tokens": 3, **body},
                        headers=headers,
                    )
                    assert answer.status_code == status, answer.text
                writer = app.state.gateway.length_samples
                assert writer is not None and writer.flush(timeout=30)
        rows = _rows(make_session_factory(engine))
    finally:
        engine.dispose()
    assert len(rows) == 2  # one per finished request; the refused one is none
    for row in rows:
        assert row.model == model and row.max_tokens == 3 and 1 <= row.output_tokens <= 3
        assert row.finish == ("length" if row.output_tokens == 3 else "stop")
        assert row.prompt is None
        stored = repr([getattr(row, c.key) for c in LengthSample.__table__.columns]).lower()
        assert not any(word in stored for word in SECRET_WORDS)
