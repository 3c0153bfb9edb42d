"""Alembic's scripts for the gateway's database, shipped inside the wheel.

A package (and package data: the version scripts and the template) so that ``pip install
tiergate`` installs them where :mod:`gateway.db.migrate` looks — beside the ``gateway``
package — and an installed gateway can run ``tiergate db upgrade`` without a checkout.
"""
