"""The data plane's request path, one module per job: admission as one ordered list of stages
(:mod:`gateway.dataplane.admission`, the stages in :mod:`gateway.dataplane.stages`).

Routing, dispatch, relay and accounting still live in :mod:`gateway.app.proxy`'s ``Job``, which
holds the request's state and runs the admission stages.
"""
