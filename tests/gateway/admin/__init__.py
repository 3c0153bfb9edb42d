"""The admin REST API's tests, one module per resource (as ``gateway/app/admin/`` is split)."""
