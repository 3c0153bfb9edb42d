"""Keep the garbage collector's full passes off the request path of a long-running server.

A full (generation 2) collection walks every tracked object. After imports and start-up a
gateway or emulated engine holds ~130,000 of them (FastAPI, pydantic, SQLAlchemy, numpy), and
one full pass measured 63 ms here — a stall of the event loop that every request in flight
sees as added latency. Almost all of those objects live as long as the process, so they are
frozen once start-up is done: later collections only look at what requests allocate.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Collect start-up garbage once, then exempt every surviving object from future passes."""
    gc.collect()
    gc.freeze()
