"""The data plane's request path, one module per job: admission as one ordered list of stages
(:mod:`gateway.dataplane.admission`, the stages in :mod:`gateway.dataplane.stages`), routing
(:mod:`gateway.dataplane.routing`), dispatch (:mod:`gateway.dataplane.dispatch`), what an
engine answered (:mod:`gateway.dataplane.answers`) and the request's end
(:mod:`gateway.dataplane.accounting`).

The relay and the entry (``serve``) still live in :mod:`gateway.app.proxy`, whose ``Job`` holds
the request's state; the modules here are functions of the job.
"""
