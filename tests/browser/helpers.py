"""What the browser tests and the screenshot script do alike on a page: sign in, find a form
field by its label, and collect what went wrong in the browser."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from playwright.sync_api import Locator, Page

CREDENTIAL_LABEL = "Operator credential or admin key"
"""The sign-in form's one field."""


@dataclass
class PageProblems:
    """What went wrong in the browser while a page was used, in words."""

    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return self.console_errors + self.failed_requests + self.page_errors

    def unexpected(self, *expected: str) -> list[str]:
        """The problems that contain none of ``expected`` (Chromium logs a page answered with
        an error status, a deliberate 409 among them, as a console error)."""
        return [p for p in self.all() if not any(e in p for e in expected)]


def sign_in(page: Page, credential: str) -> None:
    """Sign in through the login form, as a person would (the caller waits for the outcome)."""
    page.goto("/ui/login")
    page.get_by_label(CREDENTIAL_LABEL).fill(credential)
    page.get_by_role("button", name="Sign in").click()


def form_field(page: Page, label: str) -> Locator:
    """The input labelled exactly ``label`` (a required field's label ends in " *")."""
    return page.get_by_label(re.compile(rf"^{re.escape(label)}( \*)?$"))
