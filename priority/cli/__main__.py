"""``python -m priority.cli``."""

from priority.cli import app

app()
