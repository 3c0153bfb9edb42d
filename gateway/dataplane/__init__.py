"""The data plane's request path, one module per job: admission as one ordered list of stages
(:mod:`gateway.dataplane.admission`, the stages in :mod:`gateway.dataplane.stages`), routing
(:mod:`gateway.dataplane.routing`), dispatch (:mod:`gateway.dataplane.dispatch`) and what an
engine answered (:mod:`gateway.dataplane.answers`).

Relay and accounting still live in :mod:`gateway.app.proxy`'s ``Job``, which holds the
request's state; the modules here are functions of the job.
"""
