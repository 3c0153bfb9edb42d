"""The admin dashboard's files: Jinja2 templates and static assets (vendored JS with licences).

Data only: the routes that render these live in :mod:`gateway.app.ui`; this package exists so
that an installed gateway finds its templates and assets beside its code.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC_DIR", "TEMPLATES_DIR"]

ROOT = Path(__file__).resolve().parent
TEMPLATES_DIR = ROOT / "templates"
STATIC_DIR = ROOT / "static"
