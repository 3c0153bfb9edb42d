"""API key format, HMAC hashing and the persisted server secret."""

from __future__ import annotations

import hashlib
import hmac
import pickle
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from gateway.db.security import (
    PREFIX_LENGTH,
    SECRET_ID_LENGTH,
    ServerSecret,
    generate_key,
    hash_key,
    hashes_equal,
    load_or_create_secret,
    normalize_prefix,
    parse_prefix,
    secret_id,
    secrets_of,
    server_secret,
)
from gateway.settings import Settings


def test_generated_keys_have_the_documented_shape_and_are_unique() -> None:
    keys = [generate_key() for _ in range(200)]
    assert len({k.plaintext for k in keys}) == 200
    for key in keys:
        scheme, prefix, body = key.plaintext.split("-", 2)
        assert scheme == "tg"
        assert prefix == key.prefix and len(prefix) == PREFIX_LENGTH
        assert len(body) >= 40  # 32 random bytes, urlsafe base64
        assert parse_prefix(key.plaintext) == key.prefix
        assert key.plaintext not in repr(key)


@given(st.text(max_size=80))
def test_parse_prefix_only_accepts_well_formed_keys(text: str) -> None:
    prefix = parse_prefix(text)
    if prefix is not None:
        assert text.startswith(f"tg-{prefix}-") and len(text) > len(prefix) + 4


def test_parse_prefix_rejects_malformed_keys() -> None:
    for bad in (
        "",
        "tg-",
        "tg-abcd1234",
        "tg-abcd1234-",
        "sk-abcd1234-xyz",
        "tg-ABCD1234-xyz",
        "tg-abc-xyz",
        "tg-abcd12345-xyz",
    ):
        assert parse_prefix(bad) is None, bad


def test_normalize_prefix_accepts_the_forms_people_paste() -> None:
    key = generate_key()
    for form in (key.prefix, f"tg-{key.prefix}", key.plaintext, f"  tg-{key.prefix} "):
        assert normalize_prefix(form) == key.prefix


def test_hash_is_hmac_sha256_of_the_key_under_the_secret() -> None:
    key = generate_key().plaintext
    digest = hash_key("s3cret", key)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest == hmac.new(b"s3cret", key.encode(), hashlib.sha256).hexdigest()
    assert hash_key(b"s3cret", key) == digest
    assert hash_key("other", key) != digest
    assert key not in digest
    assert hashes_equal(digest, hash_key("s3cret", key))
    assert not hashes_equal(digest, hash_key("s3cret", key + "x"))


def test_secret_is_created_once_with_private_permissions(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = load_or_create_secret(data_dir)
    assert len(first) >= 40
    mode = stat.S_IMODE((data_dir / "secret").stat().st_mode)
    assert mode == 0o600
    assert load_or_create_secret(data_dir) == first
    assert [p.name for p in data_dir.iterdir()] == ["secret"]  # no temporary files left


def test_concurrent_first_use_agrees_on_one_secret(tmp_path: Path) -> None:
    results: list[str] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(load_or_create_secret(tmp_path))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len(set(results)) == 1


def test_configured_secret_wins_over_the_file(tmp_path: Path) -> None:
    configured = Settings(secret=SecretStr("from-env"), data_dir=tmp_path)
    assert server_secret(configured) == "from-env"
    assert not (tmp_path / "secret").exists()
    generated = Settings(data_dir=tmp_path)
    assert server_secret(generated) == load_or_create_secret(tmp_path) != "from-env"
    assert "from-env" not in repr(configured) and "from-env" not in str(configured)


# -- secret rotation: the current secret and the previous ones --------------------------------


def test_server_secret_is_the_current_string_and_carries_the_previous_ones() -> None:
    secret = ServerSecret("new-secret", ["old-1", "", "new-secret", "old-2", "old-1"])
    assert secret == "new-secret" and isinstance(secret, str)
    assert secret.previous == ("old-1", "old-2")  # blanks, the current one, repeats dropped
    assert secrets_of(secret) == ("new-secret", "old-1", "old-2")
    assert secrets_of("plain") == ("plain",) and secrets_of(b"raw") == (b"raw",)
    assert hash_key(secret, "tg-abcd1234-x") == hash_key("new-secret", "tg-abcd1234-x")
    shown = repr(secret) + repr([secret]) + repr({"s": secret})
    assert "new-secret" not in shown and "old-" not in shown
    copy = pickle.loads(pickle.dumps(secret))  # worker processes keep the previous ones
    assert copy == secret and copy.previous == secret.previous
    with pytest.raises(ValueError, match="must not be empty"):
        ServerSecret("")


def test_previous_secrets_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERGATE_SECRET", "current")
    monkeypatch.setenv("TIERGATE_SECRET_PREVIOUS", " old-1 , old-2,, ")
    settings = Settings(data_dir=tmp_path)
    secret = server_secret(settings)
    assert secret == "current" and secret.previous == ("old-1", "old-2")
    assert "old-1" not in repr(settings) and "old-1" not in str(settings)
    monkeypatch.delenv("TIERGATE_SECRET")  # the generated secret rotates the same way
    generated = server_secret(Settings(data_dir=tmp_path))
    assert generated == load_or_create_secret(tmp_path) and generated.previous == ("old-1", "old-2")
    monkeypatch.delenv("TIERGATE_SECRET_PREVIOUS")
    assert server_secret(Settings(data_dir=tmp_path)).previous == ()


def test_secret_id_names_a_secret_without_revealing_it() -> None:
    first = secret_id("secret-one")
    assert first == secret_id(b"secret-one") == secret_id(ServerSecret("secret-one", ["x"]))
    assert len(first) == SECRET_ID_LENGTH and int(first, 16) >= 0
    assert first != secret_id("secret-two")
    assert first != hash_key("secret-one", "")[:SECRET_ID_LENGTH]  # labelled: not a key's hash
