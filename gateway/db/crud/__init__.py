"""CRUD for the admin API and the CLI: one module per table, every mutation audited.

Functions take an open :class:`~sqlalchemy.orm.Session` and never commit: the caller owns the
transaction (``with factory.begin() as session:``), so a change and its audit row commit or roll
back together. They raise :mod:`gateway.db.errors` on bad input.
"""

from gateway.db.crud.audit import list_audit
from gateway.db.crud.backends import (
    create_backend,
    delete_backend,
    get_backend,
    list_backends,
    set_backend_enabled,
    update_backend,
)
from gateway.db.crud.keys import (
    CreatedKey,
    SecretStatus,
    authenticate,
    create_key,
    delete_key,
    get_key,
    list_keys,
    revoke_key,
    rotate_key,
    secret_status,
    update_key,
)
from gateway.db.crud.profiles import (
    ProfileEntry,
    delete_profile,
    ensure_profile,
    get_deletable_profile,
    get_profile,
    get_profile_entry,
    import_profile,
    is_known_profile,
    list_profiles,
    load_stored_profiles,
    profile_catalog,
)
from gateway.db.crud.tenants import (
    activate_tenant,
    create_tenant,
    delete_tenant,
    get_tenant,
    list_tenants,
    suspend_tenant,
    update_tenant,
)
from gateway.db.crud.tiers import create_tier, delete_tier, get_tier, list_tiers, update_tier
from gateway.db.crud.usage import UsageSummary, usage_by_tenant, usage_by_tier

__all__ = [
    "CreatedKey",
    "ProfileEntry",
    "SecretStatus",
    "UsageSummary",
    "activate_tenant",
    "authenticate",
    "create_backend",
    "create_key",
    "create_tenant",
    "create_tier",
    "delete_backend",
    "delete_key",
    "delete_profile",
    "delete_tenant",
    "delete_tier",
    "ensure_profile",
    "get_backend",
    "get_deletable_profile",
    "get_key",
    "get_profile",
    "get_profile_entry",
    "get_tenant",
    "get_tier",
    "import_profile",
    "is_known_profile",
    "list_audit",
    "list_backends",
    "list_keys",
    "list_profiles",
    "list_tenants",
    "list_tiers",
    "load_stored_profiles",
    "profile_catalog",
    "revoke_key",
    "rotate_key",
    "secret_status",
    "set_backend_enabled",
    "suspend_tenant",
    "update_backend",
    "update_key",
    "update_tenant",
    "update_tier",
    "usage_by_tenant",
    "usage_by_tier",
]
