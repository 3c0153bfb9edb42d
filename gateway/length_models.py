"""The gateway's own length models: trained from its stored samples, versioned in one folder.

A trained model is published as ``<root>/v<seq>-<version>/`` (``seq``: six digits, one more
than the newest there; ``version``: the model's own id). It is saved into a hidden temporary
folder first and renamed into place, so a worker that lists the folder sees whole models only;
the newest is the highest ``seq``. After publishing, all but the newest ``keep`` are deleted.

:func:`train_and_publish` is what the periodic trainer runs in a child process (it opens its
own database connection: only paths and numbers cross the process boundary) and what
``tiergate lengths train-db`` runs in the foreground.
"""

from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gateway.db.length_samples import load_samples
from gateway.db.session import make_engine, make_session_factory
from priority.lengths.features import FeatureConfig
from priority.lengths.model import MANIFEST, ForestParams, LengthPredictor, Progress

__all__ = ["Trained", "newest", "publish", "train_and_publish", "train_from_samples", "versions"]

_NAME = re.compile(r"v(\d{6})-[0-9A-Za-z-]+")


def versions(root: Path) -> list[Path]:
    """Published models under ``root``, oldest first (hidden and partial folders skipped)."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if _NAME.fullmatch(p.name) and p.is_dir() and (p / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def newest(root: Path) -> Path | None:
    """The newest published model under ``root``, or None."""
    found = versions(root)
    return found[-1] if found else None


def publish(predictor: LengthPredictor, root: Path, *, keep: int) -> Path:
    """Save ``predictor`` as the newest version under ``root``; keep the newest ``keep``."""
    root.mkdir(parents=True, exist_ok=True)
    last = newest(root)
    seq = int(last.name[1:7]) + 1 if last is not None else 1
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    try:
        version = predictor.save(tmp)
        final = root / f"v{seq:06d}-{version}"
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in versions(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


@dataclass(frozen=True, slots=True)
class Trained:
    """One training run's result."""

    folder: Path
    version: str
    rows: int
    censored: int


def train_from_samples(
    factory: sessionmaker[Session],
    *,
    params: ForestParams,
    limit: int,
    min_samples: int,
    censored: bool = True,
    progress: Progress | None = None,
) -> tuple[LengthPredictor, int, int] | None:
    """A predictor fitted on the newest ``limit`` stored samples of the default feature layout,
    with its row and censored-row counts; None when fewer than ``min_samples`` are stored."""
    config = FeatureConfig()
    data = load_samples(factory, config, limit=limit, censored=censored)
    rows = int(data.x.shape[0])
    if rows < max(1, min_samples):
        return None
    predictor = LengthPredictor.fit_matrix(
        data.x,
        data.y,
        config=config,
        models=data.models,
        params=params,
        data_source=f"gateway length_samples through id {data.through_id}",
        progress=progress,
    )
    return predictor, rows, data.censored


def train_and_publish(
    database_url: str,
    root: Path,
    *,
    params: ForestParams,
    limit: int,
    min_samples: int,
    keep: int,
    censored: bool = True,
) -> Trained | None:
    """Train from the samples in ``database_url`` and publish under ``root``; None when there
    are too few samples. Opens (and closes) its own engine: callable in a child process."""
    engine = make_engine(database_url)
    try:
        result = train_from_samples(
            make_session_factory(engine),
            params=params,
            limit=limit,
            min_samples=min_samples,
            censored=censored,
        )
    finally:
        engine.dispose()
    if result is None:
        return None
    predictor, rows, capped = result
    folder = publish(predictor, root, keep=keep)
    return Trained(folder=folder, version=predictor.version, rows=rows, censored=capped)
