"""Time real forward passes of a Llama/Qwen-style decoder over a grid of batch compositions.

The device-independent part of both plugins' profilers: ``python -m engine_cuda.profile_batches``
(CUDA or CPU) and ``python -m engine_ascend.profile_batches_npu`` (torch_npu) differ only in the
:class:`Device` they pass to :func:`main`. They live here, beside vLLM, because the profilers run
on the engine hosts, where the plugins are installed without the gateway.

The model (RMSNorm, RoPE, GQA attention, SwiGLU MLP, untied LM head) is built from a
:class:`~priority.models.ModelShape` (a preset name or a Hugging Face ``config.json``, read by
:func:`~priority.models.load_model_shape`) with random weights, so nothing is downloaded.
Every batch mixes prefill chunks (``l_q`` new tokens over ``l_kv`` cached ones: a KV-cache
prefix is present) and decode requests (one token over ``l_kv`` cached ones), as a
chunked-prefill engine schedules them. The output is the profile-table CSV that
``tiergate profile fit`` (or ``python -m priority.cli profile fit``) reads.

Attention, kept simple and honest:

- all tokens of the batch go through each GEMM together (as in vLLM);
- each prefill chunk writes its K/V into a per-batch cache tensor and runs one
  ``scaled_dot_product_attention`` call over ``l_kv + l_q`` keys (causal for a fresh prompt,
  an explicit offset-causal mask over a prefix);
- decodes are sorted by context length and run as one padded SDPA call per power-of-two length
  bucket, with a key-padding mask: padding waste stays under 2x however wide the spread of
  decode lengths (paged kernels have none; one call over the longest context would pay
  ``n * max(l_kv)`` where the estimator, like the real kernel, pays ``sum(l_kv)``).

Grids: ``small`` (CI), ``full`` (a profile's fitting table) and ``random`` (seeded batches
shaped like a chunked-prefill scheduler's steps, held out to measure the fitted estimator on
batches it was not fitted to).

Timing: ``--warmup`` untimed runs, then the median of ``--repeats`` runs; on CUDA each run is
bracketed by ``torch.cuda.synchronize()`` and ``time.perf_counter()``; on CPU, perf_counter.
How a device is timed and named is the one device-specific part, a :class:`Device`
(:func:`cuda_or_cpu` for torch's own devices). torch is imported lazily so the package imports
without it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from priority.models import PRESETS, ModelShape, load_model_shape
from priority.profiles.table import BatchRow, write_rows

if TYPE_CHECKING:
    import torch

Batch = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]
SOURCE = "engine_common.profiling"
"""The ``source`` column when :func:`profile` is called directly (each CLI names its own)."""

Timer = Callable[[Callable[[], object]], float]
"""Seconds one call of the given function takes on the device (synchronised as it needs)."""


def wall_timer(synchronize: Callable[[], object] | None = None) -> Timer:
    """``time.perf_counter`` around the call, bracketed by ``synchronize`` when the device runs
    asynchronously to the host (without it only the kernel launches would be timed)."""

    def timed(run: Callable[[], object]) -> float:
        if synchronize is not None:
            synchronize()
        t0 = time.perf_counter()
        run()
        if synchronize is not None:
            synchronize()
        return time.perf_counter() - t0

    return timed


@dataclass(frozen=True, slots=True)
class Device:
    """The device-specific part of profiling: where the model lives and how a pass is timed."""

    spec: str
    """torch device string (``cuda``, ``cpu``, ``npu:0``)."""
    name: str
    """Recorded in the table's ``device`` column."""
    timer: Timer
    default_dtype: str
    meta: Mapping[str, str] = field(default_factory=dict)
    """Extra metadata columns (e.g. the torch_npu version)."""


def cuda_or_cpu(spec: str | None = None) -> Device:
    """A CUDA device (synchronised wall time, bf16) or the CPU (wall time, fp32)."""
    import torch

    spec = spec or ("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda"):
        name = torch.cuda.get_device_name(spec)
        return Device(spec, name, wall_timer(partial(torch.cuda.synchronize, spec)), "bfloat16")
    return Device(spec, spec, wall_timer(), "float32")


def random_batches(
    count: int,
    *,
    seed: int = 0,
    token_budget: int = 8192,
    max_seqs: int = 256,
    max_context: int = 4096,
) -> list[Batch]:
    """``count`` seeded batches shaped like a chunked-prefill scheduler's steps.

    Each step has 0-256 decodes whose contexts are log-uniform in [16, ``max_context``] (a
    running batch mixes young and old requests) and 0-3 prefill chunks within the token budget
    left, half of them over a cached prefix. Held out from :func:`batch_grid`'s regular grid,
    they measure how a fitted profile predicts batches it never saw.
    """
    import random

    rng = random.Random(seed)
    batches: list[Batch] = []
    while len(batches) < count:
        n_dec = rng.choice((0, rng.randint(1, 16), rng.randint(16, max_seqs)))
        decode = tuple(
            sorted(
                round(math.exp(rng.uniform(math.log(16), math.log(max_context))))
                for _ in range(n_dec)
            )
        )
        left = token_budget - n_dec
        prefill: list[tuple[int, int]] = []
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            if left < 16 or len(prefill) + n_dec >= max_seqs:
                break
            l_q = min(left, round(math.exp(rng.uniform(math.log(16), math.log(token_budget)))))
            l_kv = 0 if rng.random() < 0.5 else rng.randint(16, max_context)
            prefill.append((l_q, l_kv))
            left -= l_q
        if prefill or decode:
            batches.append((tuple(prefill), decode))
    return batches


def batch_grid(kind: str, *, count: int = 96, seed: int = 0) -> list[Batch]:
    """Pure prefill (fresh and over a prefix), pure decode, and mixed batches; ``random``:
    :func:`random_batches` (``count``, ``seed``)."""
    if kind == "random":
        return random_batches(count, seed=seed)
    lq: tuple[int, ...]
    lkv: tuple[int, ...]
    dec_b: tuple[int, ...]
    dec_kv: tuple[int, ...]
    mixed: list[Batch]
    multi: list[Batch]
    if kind == "small":
        lq, lkv = (16, 128, 512), (0, 256)
        dec_b, dec_kv = (1, 4, 16), (64, 512)
        mixed = [(((128, 0),), (256,) * 4), (((64, 256),), (64, 512, 128))]
        multi = [(((64, 0), (128, 0)), ())]
    elif kind == "full":
        lq, lkv = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192), (0, 512, 2048, 4096)
        dec_b, dec_kv = (1, 2, 4, 8, 16, 32, 64, 128, 256), (128, 512, 1024, 2048, 4096)
        mixed = [
            (((q, kv),), (d,) * b)
            for q in (256, 1024, 2048)
            for kv in (0, 2048)
            for b in (8, 32, 128)
            for d in (512, 2048)
        ]
        no_decode: tuple[int, ...] = ()
        multi = [(((512, 0),) * n, no_decode) for n in (2, 4)]
        multi.append((((1024, 0), (256, 1024)), no_decode))
    else:
        raise ValueError(f"unknown grid {kind!r} (small, full or random)")
    grid: list[Batch] = [(((q, kv),), ()) for q in lq for kv in lkv]
    grid += [((), (kv,) * b) for b in dec_b for kv in dec_kv]
    return grid + mixed + multi


class Decoder:
    """Random-weight decoder; ``forward`` runs one engine step of a mixed batch."""

    def __init__(self, cfg: ModelShape, device: str, dtype: torch.dtype, seed: int = 0) -> None:
        import torch

        self.cfg, self.device, self.dtype = cfg, device, dtype
        gen = torch.Generator(device="cpu").manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            t = torch.randn(*shape, generator=gen, dtype=torch.float32) / math.sqrt(shape[-1])
            return t.to(device=device, dtype=dtype)

        c = cfg
        qkv = c.q_dim + 2 * c.kv_dim
        self.embed = w(c.vocab, c.hidden)
        self.layers: list[dict[str, Any]] = [
            {
                "ln1": torch.ones(c.hidden, device=device, dtype=dtype),
                "ln2": torch.ones(c.hidden, device=device, dtype=dtype),
                "qkv": w(qkv, c.hidden),
                "qkv_b": w(qkv) if c.qkv_bias else None,
                "o": w(c.hidden, c.q_dim),
                "gate_up": w(2 * c.ffn, c.hidden),
                "down": w(c.hidden, c.ffn),
            }
            for _ in range(c.layers)
        ]
        self.norm = torch.ones(c.hidden, device=device, dtype=dtype)
        self.lm_head = w(c.vocab, c.hidden)
        half = c.head_dim // 2
        self.inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(half, device=device, dtype=torch.float32) / half)
        )

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        import torch

        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.cfg.rms_eps)).to(x.dtype) * weight

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        import torch

        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def prepare(self, batch: Batch) -> dict[str, Any]:
        """Inputs, positions, masks and a random KV cache for ``batch`` (not timed)."""
        import torch

        c, dev = self.cfg, self.device
        prefill, decode = batch[0], tuple(sorted(batch[1]))
        n_tok = sum(q for q, _ in prefill) + len(decode)
        positions = [torch.arange(kv, kv + q) for q, kv in prefill]
        positions.append(torch.tensor(decode, dtype=torch.long))
        pos = torch.cat(positions).to(dev)
        ang = pos[:, None].float() * self.inv_freq[None, :]
        cos, sin = ang.cos().to(self.dtype)[:, None, :], ang.sin().to(self.dtype)[:, None, :]
        seqs = len(prefill) + len(decode)
        max_len = max([kv + q for q, kv in prefill] + [kv + 1 for kv in decode])
        shape = (seqs, c.kv_heads, max_len, c.head_dim)
        k_cache = torch.randn(shape, device=dev, dtype=self.dtype)
        v_cache = torch.randn(shape, device=dev, dtype=self.dtype)
        masks: list[torch.Tensor | None] = []
        for q, kv in prefill:
            if kv == 0:
                masks.append(None)
            else:
                keys = torch.arange(kv + q, device=dev)
                queries = torch.arange(kv, kv + q, device=dev)
                masks.append(keys[None, :] <= queries[:, None])
        dec_groups = []
        for start, stop in _length_buckets(decode):
            dec_len = decode[stop - 1] + 1
            lens = torch.tensor(decode[start:stop], device=dev)
            mask = (torch.arange(dec_len, device=dev)[None, :] <= lens[:, None])[:, None, None]
            dec_groups.append((start, stop, dec_len, mask))
        ids = torch.randint(0, c.vocab, (n_tok,), device=dev)
        last = torch.tensor(
            [sum(q for q, _ in prefill[: i + 1]) - 1 for i in range(len(prefill))]
            + [sum(q for q, _ in prefill) + i for i in range(len(decode))],
            device=dev,
        )
        return {
            "ids": ids,
            "cos": cos,
            "sin": sin,
            "k": k_cache,
            "v": v_cache,
            "masks": masks,
            "dec_groups": dec_groups,
            # Built here, not in forward: a host-to-device copy cannot be captured in a graph.
            "dec_rows": torch.arange(len(prefill), len(prefill) + len(decode), device=dev),
            "dec_cols": torch.tensor(decode, dtype=torch.long, device=dev),
            "last": last,
            "batch": (prefill, decode),
        }

    def forward(self, inp: dict[str, Any]) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        c = self.cfg
        prefill, decode = inp["batch"]
        k_cache, v_cache = inp["k"], inp["v"]
        x = self.embed[inp["ids"]]
        q_dim, kv_dim = c.q_dim, c.kv_dim
        n_pre = len(prefill)
        for layer in self.layers:
            h = self._rms(x, layer["ln1"])
            qkv = F.linear(h, layer["qkv"], layer["qkv_b"])
            q, k, v = qkv.split((q_dim, kv_dim, kv_dim), dim=-1)
            q = self._rope(q.view(-1, c.q_heads, c.head_dim), inp["cos"], inp["sin"])
            k = self._rope(k.view(-1, c.kv_heads, c.head_dim), inp["cos"], inp["sin"])
            v = v.view(-1, c.kv_heads, c.head_dim)
            outs = []
            start = 0
            for i, (l_q, l_kv) in enumerate(prefill):
                sl = slice(start, start + l_q)
                k_cache[i, :, l_kv : l_kv + l_q] = k[sl].transpose(0, 1)
                v_cache[i, :, l_kv : l_kv + l_q] = v[sl].transpose(0, 1)
                mask = inp["masks"][i]
                o = F.scaled_dot_product_attention(
                    q[sl].transpose(0, 1)[None],
                    k_cache[i : i + 1, :, : l_kv + l_q],
                    v_cache[i : i + 1, :, : l_kv + l_q],
                    attn_mask=mask,
                    is_causal=mask is None,
                    enable_gqa=True,
                )
                outs.append(o[0].transpose(0, 1).reshape(l_q, q_dim))
                start += l_q
            if decode:
                rows, cols = inp["dec_rows"], inp["dec_cols"]
                k_cache[rows, :, cols] = k[start:]
                v_cache[rows, :, cols] = v[start:]
                for a, b, dec_len, mask in inp["dec_groups"]:
                    o = F.scaled_dot_product_attention(
                        q[start + a : start + b][:, :, None],
                        k_cache[n_pre + a : n_pre + b, :, :dec_len],
                        v_cache[n_pre + a : n_pre + b, :, :dec_len],
                        attn_mask=mask,
                        enable_gqa=True,
                    )
                    outs.append(o.reshape(b - a, q_dim))
            x = x + F.linear(torch.cat(outs), layer["o"])
            h = self._rms(x, layer["ln2"])
            gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        return F.linear(self._rms(x[inp["last"]], self.norm), self.lm_head)


def _length_buckets(sorted_lengths: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` runs of ``sorted_lengths`` sharing a power-of-two ceiling of ``l + 1``."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(sorted_lengths) + 1):
        if (
            i == len(sorted_lengths)
            or (sorted_lengths[i] + 1).bit_length() != (sorted_lengths[start] + 1).bit_length()
        ):
            runs.append((start, i))
            start = i
    return runs


def _cuda_graph_replay(model: Decoder, inp: dict[str, Any]) -> Callable[[], object]:
    """``forward`` captured once in a CUDA graph; returns its replay.

    vLLM replays captured graphs instead of launching a step's ~800 kernels one by one from
    Python; eager timing of a small batch measures the host's launch rate, not the GPU.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model.forward(inp)  # allocator and kernel selection settle outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.forward(inp)
    return graph.replay


def time_batch(
    model: Decoder,
    batch: Batch,
    *,
    warmup: int,
    repeats: int,
    timer: Timer | None = None,
    cuda_graph: bool = False,
) -> float:
    """Median seconds of one forward pass of ``batch`` (default timer: synchronised on CUDA);
    ``cuda_graph``: time replays of the pass captured as one CUDA graph, as vLLM runs it."""
    import torch

    if timer is None:
        timer = wall_timer(torch.cuda.synchronize if model.device.startswith("cuda") else None)
    inp = model.prepare(batch)
    times = []
    with torch.inference_mode():
        run = _cuda_graph_replay(model, inp) if cuda_graph else partial(model.forward, inp)
        for i in range(warmup + repeats):
            seconds = timer(run)
            if i >= warmup:
                times.append(seconds)
    return statistics.median(times)


def profile(
    cfg: ModelShape,
    grid: Sequence[Batch],
    *,
    device: str | Device,
    dtype: str | None = None,
    warmup: int = 2,
    repeats: int = 5,
    model_name: str = "",
    source: str = SOURCE,
    cuda_graph: bool = False,
) -> list[BatchRow]:
    """One row per batch of ``grid`` (``dtype`` default: the device's); ``cuda_graph``: time
    CUDA-graph replays (:func:`time_batch`)."""
    import torch

    dev = cuda_or_cpu(device) if isinstance(device, str) else device
    dtype = dtype or dev.default_dtype
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[
        dtype
    ]
    model = Decoder(cfg, dev.spec, torch_dtype)
    meta = {
        "source": source,
        "device": dev.name,
        "dtype": dtype,
        "model": model_name,
        "torch": torch.__version__,
        **dev.meta,
    }
    rows = []
    for batch in grid:
        seconds = time_batch(
            model, batch, warmup=warmup, repeats=repeats, timer=dev.timer, cuda_graph=cuda_graph
        )
        rows.append(BatchRow(batch[0], batch[1], seconds, meta=meta))
    return rows


def main(
    argv: Sequence[str] | None,
    *,
    resolve_device: Callable[[str | None], Device],
    device_help: str,
    source: str,
    description: str,
) -> None:
    """The profiling CLI; each plugin's script passes its device, its name and its help."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--model", required=True, help=f"preset ({', '.join(PRESETS)}) or config.json"
    )
    parser.add_argument("--device", default=None, help=device_help)
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="default: bfloat16 on an accelerator, float32 on cpu",
    )
    parser.add_argument("--grid", default="small", choices=["small", "full", "random"])
    parser.add_argument("--count", type=int, default=96, help="batches of the random grid")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random grid")
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="build only N layers (the times are then an N-layer model's)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="time CUDA-graph replays, as vLLM runs a step (CUDA only; eager timing of small "
        "batches measures the host's kernel-launch rate)",
    )
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)

    try:
        cfg = load_model_shape(args.model)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    if args.layers is not None:
        cfg = replace(cfg, layers=args.layers)
    rows = profile(
        cfg,
        batch_grid(args.grid, count=args.count, seed=args.seed),
        device=resolve_device(args.device),
        dtype=args.dtype,
        warmup=args.warmup,
        repeats=args.repeats,
        model_name=args.model,
        source=source,
        cuda_graph=args.cuda_graphs,
    )
    write_rows(args.output, rows)
    print(f"wrote {len(rows)} rows to {args.output}")
