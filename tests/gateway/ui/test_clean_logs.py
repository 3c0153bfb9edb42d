"""No credential, session token, CSRF token or key secret in the logs of a dashboard session.

Every logger at DEBUG (SQLAlchemy's statements and rows included) while an operator signs in
with the credential and the admin key, fails a sign-in with a tenant key, creates and rotates
keys, and signs out; then the log and the process's output are searched for each secret.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from io import StringIO

import pytest

from gateway.app.ui.sessions import SESSION_COOKIE

from .conftest import ADMIN_KEY, SECRET, UI

LOGGERS = ("gateway", "uvicorn", "sqlalchemy", "httpx", "httpcore", "fastapi", "starlette")


@pytest.fixture
def captured() -> Iterator[StringIO]:
    buffer = StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    levels = {name: logging.getLogger(name).level for name in ("", *LOGGERS)}
    logging.getLogger().addHandler(handler)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield buffer
    finally:
        logging.getLogger().removeHandler(handler)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_a_dashboard_session_logs_no_secret(
    sqlite_ui: UI, captured: StringIO, capfd: pytest.CaptureFixture[str]
) -> None:
    ui = sqlite_ui
    secrets = {"credential": ui.credential, "admin key": ADMIN_KEY, "server secret": SECRET}
    assert ui.sign_in(ui.tenant_key).status_code == 401
    secrets["tenant key"] = ui.tenant_key.split("-", 2)[2]
    assert ui.sign_in(ADMIN_KEY).status_code == 303
    secrets["admin-key session"] = ui.client.cookies[SESSION_COOKIE]
    ui.post("/ui/logout")
    assert ui.sign_in().status_code == 303
    secrets["session"] = ui.client.cookies[SESSION_COOKIE]
    secrets["csrf"] = ui.csrf()
    created = ui.post("/ui/keys/new", {"tenant": "acme"})
    key = re.search(r'id="new-secret">([^<]+)<', created.text)
    assert key is not None
    secrets["new key"] = key.group(1).split("-", 2)[2]
    rotated = ui.post(f"/ui/keys/tg-{key.group(1).split('-')[1]}/rotate", {"grace_s": "0"})
    successor = re.search(r'id="new-secret">([^<]+)<', rotated.text)
    assert successor is not None
    secrets["rotated key"] = successor.group(1).split("-", 2)[2]
    for path in ("/ui/", "/ui/tiers", "/ui/tenants", "/ui/keys", "/ui/audit"):
        assert ui.client.get(path).status_code == 200
    ui.post("/ui/logout")
    logs = captured.getvalue()
    out, err = capfd.readouterr()
    everything = "\n".join((logs, out, err))
    assert "sqlalchemy.engine" in logs  # the statements were logged: the search means something
    leaks = [name for name, value in secrets.items() if value in everything]
    assert leaks == []
