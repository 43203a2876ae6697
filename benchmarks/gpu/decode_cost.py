"""Time a real decode step's attention on a GPU and derive the cost model's ``t_token``.

The cost model's KV term (``t_token * max_g L_g``) is the part of a synchronized step that a
router controls. ``paper-dsv3`` infers ``t_token = 0.55 us`` per KV token from the paper's
throughput figures; this script measures it instead: one decode step's attention (one query
token per sequence, ``B`` sequences of ``L`` cached tokens, bf16) for the attention shapes of
MoE models served data-parallel, timed with CUDA events, then ``time = a + b * B * L`` fitted
per layer and multiplied by the layers. It needs only PyTorch (the device image's), no vLLM.

    python3 benchmarks/gpu/decode_cost.py --out DIR      # DIR/decode_cost.json, DIR/cost-SHAPE.json

The cost files keep ``paper-dsv3``'s ``t_fixed`` (weights, experts and all-to-all, which one
GPU cannot measure) and take the measured ``t_token``; ``balanceroute ab --cost FILE`` reads them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

PAPER_T_FIXED_S = 0.042


@dataclass(frozen=True)
class Shape:
    """Attention of one model, per rank (DP attention: each rank holds every head)."""

    name: str
    q_heads: int
    kv_heads: int
    head_dim: int  # keys (MLA: the latent plus the rope part)
    value_dim: int  # values (MLA: the latent)
    layers: int

    def kv_bytes(self) -> int:
        """Bytes of cache one token holds in one layer (bf16; MLA keeps the latent once)."""
        if self.kv_heads == 1 and self.value_dim < self.head_dim:
            return 2 * self.head_dim
        return 2 * self.kv_heads * (self.head_dim + self.value_dim)


SHAPES = (
    Shape("deepseek-v3-mla", 128, 1, 576, 512, 61),  # absorbed MLA: MQA over the 576-wide latent
    Shape("qwen3-235b-a22b", 64, 4, 128, 128, 94),
    Shape("mixtral-8x7b", 32, 8, 128, 128, 32),
)


def attention(
    shape: Shape, q: torch.Tensor, kv: torch.Tensor, v: torch.Tensor | None
) -> torch.Tensor:
    """One decode step's attention for every sequence: q (B, Hkv, Hq / Hkv, D), cache (B, Hkv, L, D).

    The query heads that share a KV head ride as that head's query rows (no cache copied per
    head, as FlashMLA and FlashInfer's decode kernels do)."""
    values = kv[..., : shape.value_dim] if v is None else v  # MLA: the latent's first columns
    return F.scaled_dot_product_attention(q, kv, values)


def reference(
    shape: Shape, q: torch.Tensor, kv: torch.Tensor, v: torch.Tensor | None
) -> torch.Tensor:
    """The same attention in float64 on the CPU, written out."""
    qd, kd = q.double().cpu(), kv.double().cpu()
    vd = kd[..., : shape.value_dim] if v is None else v.double().cpu()
    p = torch.softmax(qd @ kd.transpose(-1, -2) / shape.head_dim**0.5, dim=-1)
    return p @ vd


def tensors(shape: Shape, batch: int, length: int, device: str):
    """Random q, cache and values (None for MLA) in bf16."""
    g = torch.Generator(device=device).manual_seed(batch * 100_003 + length)
    rep = shape.q_heads // shape.kv_heads
    q = torch.randn(batch, shape.kv_heads, rep, shape.head_dim, device=device, generator=g)
    kv = torch.randn(batch, shape.kv_heads, length, shape.head_dim, device=device, generator=g)
    v = None
    if shape.value_dim == shape.head_dim:
        v = torch.randn(batch, shape.kv_heads, length, shape.value_dim, device=device, generator=g)
    return q.to(torch.bfloat16), kv.to(torch.bfloat16), None if v is None else v.to(torch.bfloat16)


def median_ms(fn, device: str, reps: int) -> float:
    """Median time of ``fn`` in ms after warm-up (CUDA events on a GPU)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check(shape: Shape, device: str) -> float:
    """Relative error of the timed kernel against the float64 reference (fresh inputs)."""
    q, kv, v = tensors(shape, 2, 300, device)
    out = attention(shape, q, kv, v).double().cpu()
    ref = reference(shape, q, kv, v)
    err = float((out - ref).norm() / ref.norm())
    if not err < 2e-2:
        raise SystemExit(f"{shape.name}: attention differs from the reference by {err:.3g}")
    return err


def fit(points: list[dict]) -> tuple[float, float]:
    """Least squares ``ms = a + b * tokens`` over the points."""
    x = torch.tensor([p["tokens"] for p in points], dtype=torch.float64)
    y = torch.tensor([p["ms"] for p in points], dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], dim=1)
    a, b = torch.linalg.lstsq(design, y.unsqueeze(1)).solution.squeeze(1).tolist()
    return a, b


def fastest_backend(shape: Shape, device: str) -> str:
    """The fastest of PyTorch's attention kernels that runs this shape (on a mid-size cache)."""
    if device != "cuda":
        return "default"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, kv, v = tensors(shape, 16, 8192, device)
    times = {}
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        try:
            with sdpa_kernel(backend):
                times[backend.name] = median_ms(partial(attention, shape, q, kv, v), device, 10)
        except RuntimeError as exc:  # this kernel does not take the shape
            print(f"{shape.name}: {backend.name} not usable ({str(exc).splitlines()[0][:120]})")
    print(f"{shape.name}: kernels at B 16, L 8192: {times}", flush=True)
    return min(times, key=times.get)


def measure(shape: Shape, sizes, device: str, reps: int, min_bytes: int) -> dict:
    """Per-layer times over the sizes, the fit, and the step's KV term over all layers."""
    backend = fastest_backend(shape, device)
    if backend != "default":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend)):
            row = measure_with(shape, sizes, device, reps, min_bytes)
    else:
        row = measure_with(shape, sizes, device, reps, min_bytes)
    return {"backend": backend, **row}


def measure_with(shape: Shape, sizes, device: str, reps: int, min_bytes: int) -> dict:
    """Per-layer times over the sizes with the kernel in force."""
    points = []
    for batch, length in sizes:
        if batch * length * shape.kv_bytes() < min_bytes:
            continue  # a cache this small sits in L2 and would time the cache
        ms = median_ms(
            partial(attention, shape, *tensors(shape, batch, length, device)), device, reps
        )
        bytes_read = batch * length * shape.kv_bytes()
        points.append(
            {
                "batch": batch,
                "length": length,
                "tokens": batch * length,
                "ms": ms,
                "gb_per_s": bytes_read / (ms * 1e-3) / 1e9,
            }
        )
    a, b = fit(points)
    worst = max(abs(p["ms"] - (a + b * p["tokens"])) / p["ms"] for p in points)
    return {
        "fit_max_rel_residual": worst,
        "shape": shape.__dict__,
        "rel_error": check(shape, device),
        "points": points,
        "per_layer_ms": a,
        "per_layer_us_per_token": b * 1e3,
        "t_token_s": b * 1e-3 * shape.layers,
        "launch_s": a * 1e-3 * shape.layers,
    }


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy rate in GB/s (bytes read plus written)."""
    n = 1 << 28 if device == "cuda" else 1 << 20
    src, dst = (
        torch.empty(n, dtype=torch.uint8, device=device),
        torch.empty(n, dtype=torch.uint8, device=device),
    )
    src.random_(0, 255)
    ms = median_ms(lambda: dst.copy_(src), device, 20)
    return 2 * n / (ms * 1e-3) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (a CPU check of the script)"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # the kernels that cannot run say so
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        sizes, reps, min_bytes = [(2, 256), (4, 512), (8, 512)], 3, 0
    else:
        sizes = [(b, n) for b in (8, 16, 32, 64) for n in (2048, 4096, 8192, 16384)]
        reps, min_bytes = 30, 256 << 20
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "copy_gb_per_s": copy_bandwidth(device),
        "shapes": [],
    }
    for shape in SHAPES:
        row = measure(shape, sizes, device, reps, min_bytes)
        result["shapes"].append(row)
        cost = {
            "t_fixed_s": PAPER_T_FIXED_S,
            "t_token_s": row["t_token_s"],
            "t_prefill_s": 0.0,
            "t_comm_s": 0.0,
            "prefill_chunk_tokens": 2048,
            "fit": {
                "source": "benchmarks/gpu/decode_cost.py",
                "device": result["device"],
                "shape": shape.name,
                "t_fixed": "paper-dsv3's (not measured)",
            },
        }
        (args.out / f"cost-{shape.name}.json").write_text(json.dumps(cost, indent=1))
        print(
            f"{shape.name}: t_token {row['t_token_s'] * 1e6:.4f} us per KV token per step "
            f"({shape.layers} layers; per layer {row['per_layer_us_per_token'] * 1e3:.3f} ns, "
            f"launch {row['per_layer_ms']:.3f} ms), {row['backend']}, rel error {row['rel_error']:.1e}",
            flush=True,
        )
    (args.out / "decode_cost.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({s["shape"]["name"]: s["t_token_s"] for s in result["shapes"]}))


if __name__ == "__main__":
    main()
