"""engine_ascend.profile_batches_npu where there is no NPU: the CPU path, the timing hook, and the
device resolution against a stand-in ``torch_npu`` (the real NPU run: tests/engines/test_npu.py).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from priority.profiles.fit import fit_profile
from priority.profiles.table import COLUMNS, read_rows

torch = pytest.importorskip("torch")

from engine_ascend import profile_batches_npu as npb  # noqa: E402
from engine_cuda import profile_batches as pb  # noqa: E402
from priority.models import TINY  # noqa: E402

FAST = ["--model", "tiny", "--grid", "small", "--warmup", "0", "--repeats", "1"]


def test_cpu_fallback_writes_the_cuda_scripts_table(tmp_path: Path) -> None:
    npu_csv, cuda_csv = tmp_path / "npu.csv", tmp_path / "cuda.csv"
    npb.main([*FAST, "--device", "cpu", "-o", str(npu_csv)])
    pb.main([*FAST, "--device", "cpu", "-o", str(cuda_csv)])
    header = npu_csv.read_text().splitlines()[0].split(",")
    assert header == cuda_csv.read_text().splitlines()[0].split(",")
    assert tuple(header[:4]) == COLUMNS
    rows = read_rows(npu_csv)
    assert [(r.prefill, r.decode_kv) for r in rows] == pb.batch_grid("small")
    assert {r.meta["source"] for r in rows} == {npb.SOURCE}
    assert {(r.meta["device"], r.meta["dtype"]) for r in rows} == {("cpu", "float32")}
    profile = fit_profile(rows, name="tiny-cpu", hardware="cpu", model="tiny")
    assert profile.fit["rows"] == len(rows)
    assert profile.estimator().batch_time(prefill=[(128, 0)]) > 0


class FakeEvent:
    def __init__(self, log: list[str], clock: list[float], *, enable_timing: bool) -> None:
        assert enable_timing, "elapsed_time needs enable_timing=True"
        self.log, self.clock = log, clock
        self.t: float | None = None

    def record(self) -> None:
        self.log.append("record")
        self.t = self.clock[0]

    def synchronize(self) -> None:
        self.log.append("event-sync")

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return end.t - self.t  # milliseconds, as torch_npu's


class FakeNpu:
    """The parts of ``torch_npu.npu`` the profiler uses; the device clock is in milliseconds."""

    def __init__(self, *, available: bool = True) -> None:
        self.log: list[str] = []
        self.clock = [0.0]
        self.available = available
        self.device: str | None = None

    def synchronize(self) -> None:
        self.log.append("sync")

    def Event(self, *, enable_timing: bool = False) -> FakeEvent:
        return FakeEvent(self.log, self.clock, enable_timing=enable_timing)

    def is_available(self) -> bool:
        return self.available

    def set_device(self, spec: str) -> None:
        self.device = spec

    def get_device_name(self, spec: str) -> str:
        return f"Ascend910B2 ({spec})"


def test_event_timer_measures_between_events_in_seconds() -> None:
    npu = FakeNpu()

    def work() -> None:
        npu.log.append("run")
        npu.clock[0] += 12.5  # the device spends 12.5 ms

    seconds = npb.event_timer(npu)(work)
    assert seconds == pytest.approx(0.0125)
    # queued work drained first; the end event waited on before reading the time
    assert npu.log == ["sync", "record", "run", "record", "event-sync"]


def test_time_batch_takes_the_median_of_the_timed_repeats() -> None:
    model = pb.Decoder(TINY, "cpu", torch.float32)
    seen: list[int] = []

    def timer(run: object) -> float:
        assert callable(run)
        run()
        seen.append(len(seen))
        return [9.0, 1.0, 3.0, 2.0][len(seen) - 1]  # the first is the warm-up

    seconds = pb.time_batch(model, (((4, 0),), (3,)), warmup=1, repeats=3, timer=timer)
    assert len(seen) == 4 and seconds == 2.0


def _fake_torch_npu(monkeypatch: pytest.MonkeyPatch, npu: FakeNpu) -> None:
    module = types.ModuleType("torch_npu")
    module.npu = npu  # type: ignore[attr-defined]
    module.__version__ = "2.10.0.post1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", module)


def test_npu_device_is_resolved_through_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    npu = FakeNpu()
    _fake_torch_npu(monkeypatch, npu)
    device = npb.npu_or_cpu(None)
    assert (device.spec, npu.device, device.default_dtype) == ("npu:0", "npu:0", "bfloat16")
    assert device.name == "Ascend910B2 (npu:0)"
    assert device.meta == {"torch_npu": "2.10.0.post1"}
    npu.clock[0] = 5.0
    assert device.timer(lambda: npu.clock.__setitem__(0, 7.0)) == pytest.approx(0.002)
    assert npb.npu_or_cpu("npu:3").spec == "npu:3" and npu.device == "npu:3"


@pytest.mark.parametrize(
    ("spec", "fake", "message"),
    [
        ("npu:0", None, "torch-npu==2.10"),  # torch_npu not installed
        ("npu:0", FakeNpu(available=False), "sees no NPU"),
        ("cuda", FakeNpu(), "engine_cuda.profile_batches"),
    ],
)
def test_unusable_devices_fail_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch, spec: str, fake: FakeNpu | None, message: str
) -> None:
    if fake is None:
        monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes the import fail
    else:
        _fake_torch_npu(monkeypatch, fake)
    with pytest.raises(SystemExit, match=message):
        npb.npu_or_cpu(spec)
    assert npb.npu_or_cpu("cpu").spec == "cpu"  # the fallback never needs torch_npu


def test_cli_rejects_an_unknown_model_before_touching_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(SystemExit, match="not a preset"):
        npb.main(["--model", "no-such-model", "-o", str(tmp_path / "x.csv")])
    assert not (tmp_path / "x.csv").exists()
