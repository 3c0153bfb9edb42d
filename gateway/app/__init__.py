"""The gateway's FastAPI app: OpenAI endpoints, admission, routing, relay, accounting, metrics.

Modules, one job each: :mod:`~gateway.app.state`
(what handlers share), :mod:`~gateway.app.auth` (key cache), :mod:`~gateway.app.backends`
(backends, routers, probes, breaker), :mod:`~gateway.app.slo` (SLO headers, engine hints),
:mod:`~gateway.app.schemas` (body checks), :mod:`~gateway.app.proxy` (the request path),
:mod:`~gateway.app.metrics`, :mod:`~gateway.app.admin` (the admin API, one router per
resource), :mod:`~gateway.app.app` (assembly). Errors: :mod:`gateway.errors`, shared with the
admin API and the emulated engine.
"""

from gateway.app.app import create_app
from gateway.app.backends import BackendSpec
from gateway.app.state import GatewayState, StateDep, get_state

__all__ = ["BackendSpec", "GatewayState", "StateDep", "create_app", "get_state"]
