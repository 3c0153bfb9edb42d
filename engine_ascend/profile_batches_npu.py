"""Time real forward passes on an Ascend NPU: :mod:`engine_common.profiling` on torch_npu.

    python -m engine_ascend.profile_batches_npu --model qwen2-7b -o 910b-qwen2-7b.csv
    python -m engine_ascend.profile_batches_npu --model /models/Qwen2-7B/config.json -o t.csv
    python -m priority.cli profile fit 910b-qwen2-7b.csv -o my-910b.json --hardware ascend-910b

The model (random weights from a preset or a ``config.json``: nothing is downloaded, such hosts
usually have no internet), the batch grid and the CSV are :mod:`engine_common.profiling`'s, as
for ``engine_cuda.profile_batches``; only the :class:`~engine_common.profiling.Device` differs.
``import torch_npu`` registers the ``npu`` device; the NPU runs asynchronously to the host like
CUDA, so each pass is timed on the device between two ``Event(enable_timing=True)`` records after
a ``synchronize()``. bf16 by default (``--dtype float16`` for fp16). The table gains one metadata
column, ``torch_npu`` (its version), which ``profile fit`` keeps as row metadata.

``--device cpu`` runs the same code on the CPU (wall time, fp32, the same columns as the CUDA
script's CPU run), so the device-independent path is tested where there is no NPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine_common.profiling import Device, Timer, cuda_or_cpu
from engine_common.profiling import main as _profile_main

SOURCE = "engine_ascend.profile_batches_npu"
DEFAULT_DEVICE = "npu:0"


def event_timer(npu: Any) -> Timer:
    """Device time between two timing events around the call (``npu``: ``torch_npu.npu``).

    ``elapsed_time`` is in milliseconds, as CUDA's. The leading ``synchronize`` keeps work
    queued before the call (the inputs' copies) out of the measure.
    """

    def timed(run: Callable[[], object]) -> float:
        npu.synchronize()
        start = npu.Event(enable_timing=True)
        end = npu.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    return timed


def _torch_npu() -> Any:
    try:
        import torch_npu
    except (ImportError, OSError, RuntimeError) as exc:
        raise SystemExit(
            f"torch_npu is not importable ({exc}); on a 910B host install the CANN toolkit and "
            "torch-npu for your torch (pip install torch-npu==2.10.*), or pass --device cpu"
        ) from None
    return torch_npu


def npu_or_cpu(spec: str | None = None) -> Device:
    """An Ascend NPU (``npu`` / ``npu:N``, default ``npu:0``; event timing, bf16) or the CPU."""
    spec = spec or DEFAULT_DEVICE
    if spec == "cpu":
        return cuda_or_cpu("cpu")
    if spec != "npu" and not spec.startswith("npu:"):
        raise SystemExit(
            f"--device {spec!r}: expected npu, npu:N or cpu (CUDA: engine_cuda.profile_batches)"
        )
    torch_npu = _torch_npu()
    npu = torch_npu.npu  # what ``torch.npu`` is, once torch_npu is imported
    if not npu.is_available():
        raise SystemExit("torch_npu sees no NPU (`npu-smi info` lists them); or pass --device cpu")
    npu.set_device(spec)
    return Device(
        spec=spec,
        name=str(npu.get_device_name(spec)),
        timer=event_timer(npu),
        default_dtype="bfloat16",
        meta={"torch_npu": str(getattr(torch_npu, "__version__", "unknown"))},
    )


def main(argv: Sequence[str] | None = None) -> None:
    _profile_main(
        argv,
        resolve_device=npu_or_cpu,
        device_help=f"npu, npu:N or cpu (default: {DEFAULT_DEVICE})",
        source=SOURCE,
        description=(__doc__ or "").split("\n\n")[0],
    )


if __name__ == "__main__":
    main()
