"""The gateway's configuration: every ``TIERGATE_*`` environment variable, in one object.

Everything that configures the gateway reads :func:`get_settings` so that the environment is
parsed once and a typo in a variable's value fails at start-up, not on the first request.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./tiergate.db"


class Settings(BaseSettings):
    """``TIERGATE_DATABASE_URL``, ``TIERGATE_REDIS_URL``, ``TIERGATE_SECRET``, ...

    Secrets are :class:`~pydantic.SecretStr` so that printing or logging the settings never
    shows them.
    """

    model_config = SettingsConfigDict(env_prefix="TIERGATE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL; SQLite (default) or postgresql+psycopg://...",
    )
    redis_url: str | None = Field(
        default=None, description="Redis for shared rate limits; unset = in-process limits"
    )
    secret: SecretStr | None = Field(
        default=None,
        description="HMAC key for API keys; unset = created once in <data_dir>/secret",
    )
    admin_key: SecretStr | None = Field(default=None, description="bearer token of the admin API")
    data_dir: Path = Field(
        default=Path("~/.tiergate"), description="where the generated server secret is kept"
    )

    @property
    def data_path(self) -> Path:
        """``data_dir`` with ``~`` expanded."""
        return self.data_dir.expanduser()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call ``get_settings.cache_clear()``)."""
    return Settings()
