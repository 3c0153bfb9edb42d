"""API keys and the server secret.

A key is ``tg-<prefix8>-<secret>``. Only ``HMAC-SHA256(server secret, key)`` (hex) and the
prefix are stored: a leaked database gives neither usable keys nor a way to test guesses
offline without the server secret. The prefix identifies a key to humans (lists, revocation)
and is not secret. Nothing in this module logs a key or the secret.

The secret can be rotated (``docs/operations/security.md``): :class:`ServerSecret` is the
current secret, which hashes every new key, plus the previous ones that lookups still try, and
each key records which secret hashed it (:func:`secret_id`), so the operator can tell when no
usable key needs a previous secret any more.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.settings import Settings

KEY_SCHEME = "tg"
PREFIX_LENGTH = 8
PREFIX_ALPHABET = string.ascii_lowercase + string.digits  # no '-': the key splits on it
SECRET_BYTES = 32  # 256 bits of randomness in the key's secret part
SECRET_FILE_NAME = "secret"
SECRET_ID_LENGTH = 16  # hex digits: 64 bits, enough to tell a handful of secrets apart
_SECRET_ID_LABEL = b"tiergate secret id v1"


class ServerSecret(str):
    """The current server secret — this string, what every new key is hashed under — and
    ``previous``: retired secrets whose keys still authenticate until they are re-hashed.

    A ``str`` so that everything that hashes with "the secret" (the auth cache, key creation)
    takes it unchanged; only :func:`secrets_of` (authentication) reads ``previous``. Its
    ``repr`` shows neither value.
    """

    previous: tuple[str, ...]

    def __new__(cls, current: str, previous: Iterable[str] = ()) -> ServerSecret:
        if not current:
            raise ValueError("the server secret must not be empty")
        self = super().__new__(cls, current)
        kept = (p for p in dict.fromkeys(previous) if p and p != current)
        self.previous = tuple(kept)
        return self

    def __repr__(self) -> str:
        return f"ServerSecret(<hidden>, previous=<{len(self.previous)} hidden>)"

    def __reduce__(self) -> tuple[type[ServerSecret], tuple[str, tuple[str, ...]]]:
        # keep ``previous`` across pickling (worker processes); str's default would drop it
        return (ServerSecret, (str(self), self.previous))


def secrets_of(secret: str | bytes) -> tuple[str | bytes, ...]:
    """The secrets a presented key is tried under, current first."""
    return (secret, *getattr(secret, "previous", ()))


def secret_id(secret: str | bytes) -> str:
    """A short, stable name of a secret, stored with each key it hashed.

    ``HMAC(secret, label)``: it names the secret without revealing it. (Whoever holds one
    plaintext key and the database could test guesses of the secret anyway, with the key's
    hash; neither this nor that helps against a secret of 32 random bytes, the generated one.)
    """
    secret_bytes = secret.encode() if isinstance(secret, str) else secret
    digest = hmac.new(secret_bytes, _SECRET_ID_LABEL, hashlib.sha256).hexdigest()
    return digest[:SECRET_ID_LENGTH]


@dataclass(frozen=True, slots=True)
class GeneratedKey:
    """A new key: ``plaintext`` is shown once and never stored; ``key_hash`` is."""

    plaintext: str
    prefix: str

    def __repr__(self) -> str:  # keep the plaintext out of logs and tracebacks
        return f"GeneratedKey(prefix={self.prefix!r}, plaintext=<hidden>)"


def generate_key() -> GeneratedKey:
    """A fresh random key from :mod:`secrets`."""
    prefix = "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))
    plaintext = f"{KEY_SCHEME}-{prefix}-{secrets.token_urlsafe(SECRET_BYTES)}"
    return GeneratedKey(plaintext=plaintext, prefix=prefix)


def parse_prefix(key: str) -> str | None:
    """The prefix of a well-formed key, or None (reject without touching the database)."""
    scheme, sep, rest = key.partition("-")
    prefix, sep2, body = rest.partition("-")
    if scheme != KEY_SCHEME or not sep or not sep2 or not body:
        return None
    if len(prefix) != PREFIX_LENGTH or any(c not in PREFIX_ALPHABET for c in prefix):
        return None
    return prefix


def normalize_prefix(text: str) -> str:
    """``tg-abcd1234``, ``abcd1234`` or a whole key → ``abcd1234`` (what revocation accepts)."""
    text = text.strip()
    if text.startswith(f"{KEY_SCHEME}-"):
        text = text[len(KEY_SCHEME) + 1 :]
    return text.split("-", 1)[0]


def display_prefix(prefix: str) -> str:
    return f"{KEY_SCHEME}-{prefix}"


def hash_key(secret: str | bytes, key: str) -> str:
    """``HMAC-SHA256(secret, key)`` as 64 hex digits."""
    secret_bytes = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(secret_bytes, key.encode(), hashlib.sha256).hexdigest()


def hashes_equal(a: str, b: str) -> bool:
    """Constant-time comparison of two hex digests."""
    return hmac.compare_digest(a.encode(), b.encode())


def load_or_create_secret(data_dir: Path) -> str:
    """The secret kept in ``<data_dir>/secret``, created once (0600) if absent.

    Creation is atomic — written to a private temporary file, then hard-linked into place — so
    two processes starting together agree on one secret and nobody reads a half-written file.
    """
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / SECRET_FILE_NAME
    if not path.exists():
        tmp = data_dir / f".{SECRET_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(SECRET_BYTES) + "\n")
            with contextlib.suppress(FileExistsError):  # another process won the race
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    secret = path.read_text().strip()
    if not secret:
        raise RuntimeError(f"the server secret file {path} is empty")
    return secret


def previous_secrets(settings: Settings) -> tuple[str, ...]:
    """``TIERGATE_SECRET_PREVIOUS``: comma-separated, blanks ignored."""
    if settings.secret_previous is None:
        return ()
    parts = settings.secret_previous.get_secret_value().split(",")
    return tuple(p.strip() for p in parts if p.strip())


def server_secret(settings: Settings) -> ServerSecret:
    """``TIERGATE_SECRET`` if set, else the persisted secret in the data directory; with the
    previous secrets of ``TIERGATE_SECRET_PREVIOUS``."""
    if settings.secret is not None and settings.secret.get_secret_value():
        current = settings.secret.get_secret_value()
    else:
        current = load_or_create_secret(settings.data_path)
    return ServerSecret(current, previous_secrets(settings))
