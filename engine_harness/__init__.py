"""Replays of the engines' schedulers on a virtual clock: the proof that the engines, the
simulator and the fleet agree, request by request, and the benches built on it.

Not runtime: nothing that runs inside vLLM, the gateway or the emulated engine imports this
package. It sits above the plugins (it builds vLLM's scheduler with ``engine_cuda``'s class),
so ``engine_common`` stays the shared layer they import and never reaches up into one.

* :mod:`~engine_harness.sim_replay` — a trace through the simulator's engine on a virtual clock,
  with the gateway's metadata exactly as the engine would decode it (pure: no vLLM);
* :mod:`~engine_harness.replay` — a real vLLM scheduler (stock, or ours with any policy) on a
  virtual clock, without a model or a GPU (imports vLLM);
* :mod:`~engine_harness.fleet_replay` — the fleet: every instance a real vLLM scheduler, a
  router of :mod:`priority.routing` in front, co-located or PD-disaggregated (prefill and decode
  schedulers joined by vLLM's KV-connector interface; imports vLLM).
"""
