"""Admission's stages, one module per concern; :mod:`gateway.dataplane.admission` orders them.

Each stage is ``run(job, http)``: it reads what earlier stages left on the job, writes its own
result there, and refuses by raising (``ApiError`` / ``AdmissionRejected``). A stage with nothing
to await returns None instead of a coroutine, so the common path allocates no coroutine for it.
"""
