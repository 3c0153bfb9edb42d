"""Length samples: written off the request path, best effort; read back by the trainer.

The request path only appends the request's :class:`~priority.lengths.features.RequestFeatures`
(built for the prediction anyway) to a bounded in-memory list (:meth:`SampleWriter.submit`:
O(1), no database, no featurizing). One background thread inserts what arrived, in batches. A
request the loaded model predicted carries the row its prediction computed, and the writer
reuses it when the model's layout is the writer's (``Featurizer.transform_once``): the prompt is
hashed once per request. The others (no model, or one of another layout) are featurized here, a
chunk per scikit-learn call (far cheaper than one per request). The prompt text lives in
memory only until then and is stored only when the operator turned ``store_prompts`` on.

Unlike usage records (:mod:`gateway.db.usage`), a sample is *training data*: a batch the
database refuses for any reason is dropped and counted, never retried or spooled, and past
``queue_limit`` pending samples new ones are dropped too. A database outage therefore costs
samples, never usage records (the two writers share nothing but the session factory) and never
a request. The table is kept to ``max_rows`` rows: after writing, the writer deletes the oldest
rows past the cap, by id.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.errors import describe
from gateway.db.models import LengthSample, utcnow
from gateway.db.usage import storable_text
from priority.lengths.features import FeatureConfig, Featurizer, RequestFeatures

if TYPE_CHECKING:
    from numpy.typing import NDArray

log = logging.getLogger(__name__)

_TABLE = LengthSample.metadata.tables[LengthSample.__tablename__]
MODEL_CHARS = 256
"""``length_samples.model`` is VARCHAR(256)."""
PROMPT_CHARS = 100_000
"""The most prompt text kept per sample where the operator stores prompts."""
FEATURIZE_CHUNK = 32
"""Requests featurized per call before the writer yields the GIL to the event loop."""
PRUNE_EVERY = 0.05
"""Prune once the rows written since the last prune reach this share of ``max_rows``."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished request waiting to be written."""

    features: RequestFeatures
    output_tokens: int
    finish: str
    created_at: datetime = field(default_factory=utcnow)


def finish_of(features: RequestFeatures, output_tokens: int) -> str:
    """``length`` when the output reached the request's ``max_tokens`` (the engine stopped it
    there: the true length is censored at that cap), else ``stop`` (its true length)."""
    capped = features.max_tokens is not None and output_tokens >= features.max_tokens
    return "length" if capped else "stop"


def tenant_hash(tenant: str | None, key: bytes) -> str | None:
    """``tenant`` keyed-hashed (BLAKE2b under the server secret, 16 hex digits): samples group
    by tenant without naming it, and a list of likely names cannot be hashed to match."""
    if tenant is None:
        return None
    return hashlib.blake2b(tenant.encode(), key=key[:64], digest_size=8).hexdigest()


class SampleWriter:
    """Queue finished requests as length samples and write them from a background thread.

    ``store_prompts``: keep the raw prompt text beside the features (the operator's choice;
    default off). ``max_rows``: the table's row cap. ``queue_limit``: samples held in memory
    (past it, dropped). ``tenant_key``: the key of :func:`tenant_hash`.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        tenant_key: bytes,
        store_prompts: bool = False,
        max_rows: int = 200_000,
        queue_limit: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 1.0,
        config: FeatureConfig | None = None,
    ) -> None:
        if max_rows < 1 or queue_limit < 1 or batch_size < 1 or flush_interval_s <= 0:
            raise ValueError("max_rows, queue_limit, batch_size and flush_interval_s must be > 0")
        self._factory = session_factory
        self._key = tenant_key
        self.store_prompts = store_prompts
        self.max_rows = max_rows
        self._queue_limit = queue_limit
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self.config = config or FeatureConfig()
        self.layout = self.config.layout_id()
        self._featurizer: Featurizer | None = None
        self._pending: list[Sample] = []
        self._cond = threading.Condition()
        self._requested = 0  # flush requests made / served (generation numbers)
        self._served = 0
        self._stopping = False
        self._since_prune = 0
        self.submitted = 0
        self.written = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="length-samples", daemon=True)
        self._thread.start()

    # -- the request path's side ----------------------------------------------------------

    def submit(self, features: RequestFeatures, output_tokens: int) -> None:
        """Queue a finished request (``output_tokens`` delivered); O(1), never blocks on the
        database. Dropped (counted) when ``queue_limit`` samples are already waiting."""
        sample = Sample(features, output_tokens, finish_of(features, output_tokens))
        with self._cond:
            self.submitted += 1
            if self._stopping or len(self._pending) >= self._queue_limit:
                self.dropped += 1
                return
            self._pending.append(sample)
            if len(self._pending) == self._batch_size:
                self._cond.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything submitted before this call is written or dropped."""
        with self._cond:
            self._requested += 1
            target = self._requested
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._served >= target, timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is pending (one attempt), then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- the background thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._due():
                    self._cond.wait(self._interval)
                batch, self._pending = self._pending, []
                stopping, generation = self._stopping, self._requested
            try:
                if batch:
                    self._write(batch)
            except Exception:  # a bug here must not stop the thread; samples are expendable
                log.exception("length sample writer failed; %d sample(s) dropped", len(batch))
                self.dropped += len(batch)
            with self._cond:
                self._served = generation
                self._cond.notify_all()
            if stopping:
                return

    def _due(self) -> bool:
        return (
            self._stopping
            or self._requested > self._served
            or len(self._pending) >= self._batch_size
        )

    def _write(self, batch: list[Sample]) -> None:
        rows = self._rows(batch)
        try:
            with self._factory.begin() as session:
                session.execute(insert(_TABLE), rows)
        except Exception as exc:  # the database's state or a value: either way, drop them
            self.dropped += len(rows)
            log.warning("dropping %d length sample(s): %s", len(rows), describe_error(exc))
            return
        self.written += len(rows)
        self._since_prune += len(rows)
        if self._since_prune >= max(1, int(self.max_rows * PRUNE_EVERY)):
            self._since_prune = 0
            try:
                prune(self._factory, self.max_rows)
            except Exception as exc:  # next time: the cap is a bound, not an invariant
                log.warning("could not prune length samples: %s", describe_error(exc))

    def _rows(self, batch: list[Sample]) -> list[dict[str, Any]]:
        featurizer = self._featurizer
        if featurizer is None:  # scikit-learn loads here: only where learning is on
            featurizer = self._featurizer = Featurizer(self.config)
        rows: list[dict[str, Any]] = []
        for start in range(0, len(batch), FEATURIZE_CHUNK):
            chunk = batch[start : start + FEATURIZE_CHUNK]
            vectors = featurizer.transform_once([s.features for s in chunk])
            for sample, vector in zip(chunk, vectors, strict=True):
                rows.append(self._row(sample, vector))
            time.sleep(0)  # hand the GIL back to the event loop between chunks
        return rows

    def _row(self, sample: Sample, vector: NDArray[np.float32]) -> dict[str, Any]:
        f = sample.features
        return {
            "model": storable_text(f.model, MODEL_CHARS),
            "tenant_hash": tenant_hash(f.tenant, self._key),
            "layout": self.layout,
            "features": vector.astype(np.float32).tobytes(),
            "prompt_tokens": f.tokens(),
            "max_tokens": f.max_tokens,
            "output_tokens": sample.output_tokens,
            "finish": sample.finish,
            "prompt": storable_text(f.prompt, PROMPT_CHARS) if self.store_prompts else None,
            "created_at": sample.created_at,
        }


def describe_error(exc: Exception) -> str:
    """The error's kind, never its text (it may quote the values)."""
    from sqlalchemy.exc import SQLAlchemyError

    return describe(exc) if isinstance(exc, SQLAlchemyError) else type(exc).__name__


def prune(factory: sessionmaker[Session], max_rows: int) -> int:
    """Delete the oldest samples past the newest ``max_rows`` (by id); returns rows deleted."""
    with factory.begin() as session:
        cutoff = session.execute(
            select(_TABLE.c.id).order_by(_TABLE.c.id.desc()).offset(max_rows).limit(1)
        ).scalar_one_or_none()
        if cutoff is None:
            return 0
        result = session.execute(delete(_TABLE).where(_TABLE.c.id <= cutoff))
        return int(result.rowcount)  # type: ignore[attr-defined]


def count_samples(factory: sessionmaker[Session], layout: str) -> int:
    """Samples stored in ``layout``."""
    with factory() as session:
        query = select(func.count()).select_from(_TABLE).where(_TABLE.c.layout == layout)
        return int(session.execute(query).scalar_one())


@dataclass(frozen=True, slots=True)
class TrainingSet:
    """Stored samples as the forest takes them."""

    x: NDArray[np.float32]
    y: NDArray[np.float64]
    models: Sequence[str]
    censored: int
    """Rows that reached their ``max_tokens`` (kept, at that cap: see :func:`load_samples`)."""
    through_id: int
    """The newest sample's id."""


def load_samples(
    factory: sessionmaker[Session],
    config: FeatureConfig,
    *,
    limit: int,
    censored: bool = True,
) -> TrainingSet:
    """The newest ``limit`` samples of ``config``'s layout.

    A ``length``-finished (censored) sample is kept by default with its output at the cap it
    reached: the model predicts the *realised* output length, which ``max_tokens`` (one of the
    features) bounds, and dropping those rows would bias the bound low exactly for the longest
    answers. ``censored=False`` trains on ``stop``-finished rows only.
    """
    width, c = config.width, _TABLE.c
    query = (
        select(c.id, c.features, c.output_tokens, c.model, c.finish)
        .where(c.layout == config.layout_id())
        .order_by(c.id.desc())
        .limit(limit)
    )
    if not censored:
        query = query.where(c.finish == "stop")
    vectors: list[bytes] = []
    ys: list[int] = []
    models: set[str] = set()
    capped = through = 0
    with factory() as session:
        for row_id, blob, output, model, finish in session.execute(query):
            if len(blob) != width * 4:  # not this layout's width: never trained on
                continue
            through = max(through, int(row_id))
            vectors.append(bytes(blob))
            ys.append(int(output))
            models.add(model)
            capped += finish == "length"
    x = np.frombuffer(b"".join(vectors), dtype=np.float32).reshape(len(vectors), width)
    return TrainingSet(
        x=x,
        y=np.asarray(ys, dtype=np.float64),
        models=sorted(models),
        censored=capped,
        through_id=through,
    )
