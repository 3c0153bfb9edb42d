"""What the length predictor sees of a request, as a small dense vector.

The gateway calls the predictor once per request, so features must be cheap (well under a
millisecond) and stable across processes: text goes through hashed word and character n-grams
(no vocabulary to fit or ship, and hashing keeps no prompt text in the model), the model and
tenant names through a keyed-free but process-stable hash (:func:`stable_bucket`, not Python's
randomised ``hash``), sizes through ``log1p`` so trees split on orders of magnitude.

Prompt tokens, when the caller does not know them, come from :func:`approx_tokens`: the same
~4-characters-per-token stand-in the gateway uses (``gateway/tokens.py``, which the core must
not import), so a model trained on files from ``scripts/lengths_dataset.py`` sees at serving
time the same counts it was trained on.

A long prompt's text is hashed only in part: its first and last ``max_text_chars / 2``
characters (:meth:`FeatureConfig.hashed_text`). Hashing costs ~0.6 µs a character here
(5-6 ms for 8k characters) and the prediction has a 5 ms budget beside admission, so without
the cut exactly the long prompts (where a length bound matters most) would go without one. The
numeric columns (lines, questions, characters, tokens) still see the whole prompt: counting
is ~1,000x cheaper per character (about 0.2 ms for 512k).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_TEXT_CHARS",
    "FeatureConfig",
    "Featurizer",
    "RequestFeatures",
    "approx_tokens",
    "stable_bucket",
]

CHARS_PER_TOKEN = 4
"""The gateway's stand-in tokenizer: about four characters per token (OpenAI's rule of thumb)."""


DEFAULT_MAX_TEXT_CHARS = 1024
"""New layouts hash at most this many prompt characters (head and tail halves). Chosen with
``bench/lengths_long_prompts.py``: on the gateway's loaded 2-CPU box a prediction then takes
1.6-2.3 ms (p50, under 3 ms p90) at 2k to 512k characters, against 2.0-3.4 ms with 2048; on
the HH-RLHF split its pinball loss moves by < 1% overall (``bench/lengths_eval.py``)."""


def approx_tokens(text: str) -> int:
    """Tokens of ``text`` under the ~4-characters-per-token stand-in (at least 1)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


QUESTIONS_CAP = 16
"""The ``questions`` column counts question marks up to this many."""


def _count_upto(text: str, char: str, cap: int) -> int:
    """``min(text.count(char), cap)``, stopping at the ``cap``-th: ``str.find`` scans with
    ``memchr``, ~20x faster than ``str.count`` over a long prompt (0.2-0.3 ms at 512k chars)."""
    found = 0
    at = text.find(char)
    while at >= 0:
        found += 1
        if found >= cap:
            break
        at = text.find(char, at + 1)
    return found


def stable_bucket(name: str, buckets: int) -> int:
    """``name``'s bucket in ``[0, buckets)``: the same in every process (BLAKE2b, not ``hash``)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """One request as the predictor sees it (the gateway has all of this at admission)."""

    prompt: str
    model: str
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    tenant: str | None = None
    _vectors: dict[str, NDArray[np.float32]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Its feature rows by layout id, each computed once (:meth:`Featurizer.transform_once`)."""

    def tokens(self) -> int:
        """Prompt tokens: the caller's count, else the stand-in's."""
        return self.prompt_tokens if self.prompt_tokens is not None else approx_tokens(self.prompt)


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """The feature layout; saved in the model's manifest, so a loaded model featurizes exactly
    as it was trained. Defaults give 128 + 128 + 6 + 8 + 8 = 278 dense columns.

    ``max_text_chars``: how much of the prompt the n-grams see (:meth:`hashed_text`); ``None``
    hashes it all, which is what every manifest written before the field existed means, so
    such a model keeps featurizing exactly as it was trained (and keeps its layout id)."""

    word_dims: int = 128
    char_dims: int = 128
    word_ngrams: tuple[int, int] = (1, 2)
    char_ngrams: tuple[int, int] = (3, 4)
    model_buckets: int = 8
    tenant_buckets: int = 8
    version: int = 1
    max_text_chars: int | None = DEFAULT_MAX_TEXT_CHARS

    def __post_init__(self) -> None:
        if self.max_text_chars is not None and self.max_text_chars < 2:
            raise ValueError("max_text_chars must be >= 2 (or None: hash the whole prompt)")

    NUMERIC = (
        "log_prompt_tokens",
        "log_max_tokens",
        "has_max_tokens",
        "log_lines",
        "questions",
        "log_chars",
    )
    """Numeric columns after the hashed text."""

    @property
    def width(self) -> int:
        """Columns of the dense feature vector."""
        return (
            self.word_dims
            + self.char_dims
            + len(self.NUMERIC)
            + self.model_buckets
            + self.tenant_buckets
        )

    def hashed_text(self, prompt: str) -> str:
        """The part of ``prompt`` the n-grams see: all of it up to ``max_text_chars``, else its
        head and tail halves joined by a space (no n-gram spans the cut; what a long prompt
        asks is usually at one of its ends, the bulk in between is pasted context)."""
        limit = self.max_text_chars
        if limit is None or len(prompt) <= limit:
            return prompt
        head = limit // 2
        return prompt[:head] + " " + prompt[len(prompt) - (limit - head) :]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["word_ngrams"] = list(self.word_ngrams)
        data["char_ngrams"] = list(self.char_ngrams)
        if self.max_text_chars is None:
            del data["max_text_chars"]  # the layout as written before the field: same id
        return data

    def layout_id(self) -> str:
        """A short id of this layout (12 hex digits), the same in every process: vectors stored
        under one id can be trained on by any model of that layout, and by no other."""
        text = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:12]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FeatureConfig:
        """Inverse of :meth:`to_json`; ``ValueError`` on an unknown layout version. No
        ``max_text_chars`` (a manifest from before the field): the whole prompt is hashed."""
        if data.get("version") != 1:
            raise ValueError(f"unknown feature layout version {data.get('version')!r}")
        limit = data.get("max_text_chars")
        return cls(
            word_dims=int(data["word_dims"]),
            char_dims=int(data["char_dims"]),
            word_ngrams=(int(data["word_ngrams"][0]), int(data["word_ngrams"][1])),
            char_ngrams=(int(data["char_ngrams"][0]), int(data["char_ngrams"][1])),
            model_buckets=int(data["model_buckets"]),
            tenant_buckets=int(data["tenant_buckets"]),
            max_text_chars=None if limit is None else int(limit),
        )


class Featurizer:
    """Turns :class:`RequestFeatures` into rows of a dense ``float32`` matrix.

    scikit-learn's ``HashingVectorizer`` is stateless (nothing to fit), so a featurizer is fully
    described by its :class:`FeatureConfig`; it is imported here, lazily, because only the
    predictor (never the engines) needs scikit-learn.

    Rows are l2-normalized by the routine ``HashingVectorizer(norm="l2")`` ends in
    (``inplace_csr_row_normalize_l2``), called directly: the same arithmetic on the same
    matrix, so the same bits, without ``normalize``'s argument checks: ~0.2 ms each, 0.4 of
    the 0.7 ms a 400-character prompt took to featurize.
    """

    def __init__(self, config: FeatureConfig | None = None) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.config = config or FeatureConfig()
        c = self.config
        self._words = HashingVectorizer(
            n_features=c.word_dims,
            ngram_range=c.word_ngrams,
            alternate_sign=False,
            norm=None,
            lowercase=True,
        )
        self._chars = HashingVectorizer(
            n_features=c.char_dims,
            analyzer="char_wb",
            ngram_range=c.char_ngrams,
            alternate_sign=False,
            norm=None,
            lowercase=True,
        )
        self._normalize = _row_normalizer()
        self.layout = c.layout_id()

    def _hashed(self, vectorizer: Any, texts: list[str]) -> NDArray[np.float64]:
        """``vectorizer``'s l2-normalized rows of ``texts``, dense."""
        matrix = vectorizer.transform(texts).tocsr()
        self._normalize(matrix)
        return np.asarray(matrix.toarray())

    def transform(self, requests: Sequence[RequestFeatures]) -> NDArray[np.float32]:
        """One row per request, :attr:`FeatureConfig.width` columns."""
        c = self.config
        texts = [c.hashed_text(r.prompt) for r in requests]
        out = np.zeros((len(requests), c.width), dtype=np.float32)
        if not requests:
            return out
        out[:, : c.word_dims] = self._hashed(self._words, texts)
        col = c.word_dims
        out[:, col : col + c.char_dims] = self._hashed(self._chars, texts)
        col += c.char_dims
        for i, r in enumerate(requests):
            row = out[i]
            row[col] = math.log1p(r.tokens())
            row[col + 1] = math.log1p(r.max_tokens or 0)
            row[col + 2] = 1.0 if r.max_tokens else 0.0
            row[col + 3] = math.log1p(r.prompt.count("\n"))
            row[col + 4] = _count_upto(r.prompt, "?", QUESTIONS_CAP)
            row[col + 5] = math.log1p(len(r.prompt))
            base = col + 6
            row[base + stable_bucket(r.model, c.model_buckets)] = 1.0
            if r.tenant is not None:
                row[base + c.model_buckets + stable_bucket(r.tenant, c.tenant_buckets)] = 1.0
        return out

    def transform_once(self, requests: Sequence[RequestFeatures]) -> NDArray[np.float32]:
        """:meth:`transform`, each request featurized at most once in this layout: a row it
        already has is reused, a new one is kept on it (read-only). The gateway predicts a
        request's length and later stores it as a length sample; both need its row, and hashing
        the prompt is most of the cost of either. Not for training sets: the rows live as long
        as their requests."""
        layout = self.layout
        missing = [r for r in requests if layout not in r._vectors]
        if missing:
            for request, row in zip(missing, self.transform(missing), strict=True):
                row = row.copy()  # its own memory: not a view keeping the whole batch alive
                row.flags.writeable = False
                request._vectors[layout] = row
        out = np.empty((len(requests), self.config.width), dtype=np.float32)
        for i, request in enumerate(requests):
            out[i] = request._vectors[layout]
        return out


def _row_normalizer() -> Callable[[Any], None]:
    """scikit-learn's in-place l2 row normaliser; its documented wrapper (``normalize``, the
    same routine behind argument checks) if a release moves the undocumented module."""
    try:
        from sklearn.utils.sparsefuncs_fast import inplace_csr_row_normalize_l2
    except ImportError:  # pragma: no cover - depends on the installed scikit-learn
        from sklearn.preprocessing import normalize

        def checked(matrix: Any) -> None:
            normalize(matrix, norm="l2", copy=False)

        return checked
    normalizer: Callable[[Any], None] = inplace_csr_row_normalize_l2
    return normalizer
