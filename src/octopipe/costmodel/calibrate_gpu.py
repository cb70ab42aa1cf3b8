"""Measure, on one CUDA device, the kernels and layers the analytic cost model prices, so its
predictions can be checked and its efficiency factors calibrated (docs/COSTMODEL.md).

Standalone on purpose: it imports only torch, because a GPU machine need not hold OctoPipe's
other dependencies. It writes measured seconds and bytes as JSON; `calibration_report` compares
them with the model's predictions on this machine:

    PYTHONPATH=src python3 -m octopipe.costmodel.calibrate_gpu -o measured.json
    python -m octopipe.costmodel.calibration_report measured.json --hardware h200

The torch layers here are plain eager PyTorch (SDPA attention, unfused norms), the way a
straightforward training loop runs them; they are measuring fixtures, not OctoPipe's models.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

DTYPE = torch.bfloat16


def timed(fn: Callable[[], object], warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds of `fn` over `repeats` runs, by CUDA events (wall clock on CPU)."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            import time

            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# Fixtures ------------------------------------------------------------------------------------


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DecoderBlock(nn.Module):
    """LLaMA block: RMSNorm, GQA with rope and causal SDPA, RMSNorm, SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attn_norm = nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(hidden)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = rotate(q.view(b, s, self.heads, d).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, s, self.kv_heads, d).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.kv_heads, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, self.heads * d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Head(nn.Module):
    """Output projection and cross-entropy in FP32 (the loss is part of the last layer)."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.proj(x).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1))


# Layer measurement ---------------------------------------------------------------------------


def saved_bytes(run: Callable[[], object], exclude: set[int]) -> int:
    """Bytes of distinct storages autograd saves during `run`, parameters excluded."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def measure_layer(module: nn.Module, x: torch.Tensor, *extra: torch.Tensor) -> dict[str, float]:
    """F, I (input gradient only), B (full backward) and W = B - I of one layer, and its
    saved activation bytes."""
    x = x.detach().requires_grad_(True)
    params = [p for p in module.parameters()]

    def forward() -> torch.Tensor:
        return module(x, *extra)

    out = forward()
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)

    def forward_input_grad() -> None:
        torch.autograd.grad(forward(), [x], grad)

    def forward_backward() -> None:
        torch.autograd.grad(forward(), [x, *params], grad)

    f = timed(forward)
    fi = timed(forward_input_grad)
    fb = timed(forward_backward)
    exclude = {p.untyped_storage().data_ptr() for p in params}
    for tensor in extra:
        exclude.add(tensor.untyped_storage().data_ptr())
    act = saved_bytes(forward, exclude)
    return {"f": f, "i": fi - f, "b": fb - f, "w": fb - fi, "act_bytes": act}


def llama_layer(hidden: int, heads: int, kv: int, ffn: int, seq: int, device: str) -> dict:
    d = hidden // heads
    block = DecoderBlock(hidden, heads, kv, d, ffn).to(device, DTYPE)
    x = torch.randn(1, seq, hidden, device=device, dtype=DTYPE)
    angles = torch.outer(torch.arange(seq, device=device).float(),
                         1e-4 ** (torch.arange(0, d, 2, device=device).float() / d))
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(DTYPE), angles.sin().to(DTYPE)
    result = measure_layer(block, x, cos, sin)
    del block
    return result


def head_layer(hidden: int, vocab: int, seq: int, device: str) -> dict:
    head = Head(hidden, vocab).to(device, DTYPE)
    x = torch.randn(1, seq, hidden, device=device, dtype=DTYPE)
    target = torch.randint(0, vocab, (1, seq), device=device)
    result = measure_layer(head, x, target)
    del head
    return result


def embedding_layer(hidden: int, vocab: int, seq: int, device: str) -> dict:
    table = nn.Embedding(vocab, hidden).to(device, DTYPE)
    ids = torch.randint(0, vocab, (1, seq), device=device)
    out = table(ids)
    grad = torch.randn_like(out)
    f = timed(lambda: table(ids))
    fw = timed(lambda: torch.autograd.grad(table(ids), [table.weight], grad))
    return {"f": f, "i": 0.0, "b": fw - f, "w": fw - f}


# Kernel measurement --------------------------------------------------------------------------


def kernels(device: str, small: bool) -> dict:
    n = 1024 if small else 8192
    a = torch.randn(n, n, device=device, dtype=DTYPE)
    b = torch.randn(n, n, device=device, dtype=DTYPE)
    gemm = 2 * n**3 / timed(lambda: a @ b)
    size = (1 << 20) if small else (1 << 30)  # elements of bf16: 2 GiB read + 2 GiB written
    src = torch.empty(size, device=device, dtype=DTYPE)
    dst = torch.empty_like(src)
    copy = 2 * src.nbytes / timed(lambda: dst.copy_(src))
    out = {"gemm_flops": gemm, "copy_bytes_per_s": copy}
    for seq in ((256,) if small else (4096, 16384)):
        q = torch.randn(1, 32, seq, 128, device=device, dtype=DTYPE, requires_grad=True)
        k = torch.randn(1, 8, seq, 128, device=device, dtype=DTYPE, requires_grad=True)
        v = torch.randn(1, 8, seq, 128, device=device, dtype=DTYPE, requires_grad=True)
        flops = 2 * seq * (seq + 1) / 2 * 32 * 256  # causal: QK^T and PV over attended keys

        def attend() -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        o = attend()
        g = torch.randn_like(o)
        fwd = timed(attend)
        both = timed(lambda: torch.autograd.grad(attend(), [q, k, v], g))
        out[f"attention_{seq}"] = {"f": fwd, "b": both - fwd, "f_flops": flops}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--small", action="store_true", help="tiny shapes: check the script")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                     "torch": torch.__version__, "kernels": kernels(device, args.small)}
    print(json.dumps(results["kernels"]), flush=True)
    # (name, profile layer, builder args); shapes from the shipped configs.
    if args.small:
        layers = {"llama3-8b/layers.0@256": lambda: llama_layer(256, 4, 2, 512, 256, device),
                  "gemma2-9b/output@256": lambda: head_layer(256, 4096, 256, device),
                  "gemma2-9b/tok_embeddings@256": lambda: embedding_layer(256, 4096, 256, device)}
    else:
        layers = {
            "llama3-8b/layers.0@4096": lambda: llama_layer(4096, 32, 8, 14336, 4096, device),
            "llama3-8b/layers.0@8192": lambda: llama_layer(4096, 32, 8, 14336, 8192, device),
            "llama3-70b/layers.0@4096": lambda: llama_layer(8192, 64, 8, 28672, 4096, device),
            "llama3-8b/output@4096": lambda: head_layer(4096, 128256, 4096, device),
            "gemma2-9b/output@4096": lambda: head_layer(3584, 256000, 4096, device),
            "gemma2-9b/tok_embeddings@4096": lambda: embedding_layer(3584, 256000, 4096, device),
        }
    results["layers"] = {}
    for name, measure in layers.items():
        results["layers"][name] = measure()
        print(name, json.dumps(results["layers"][name]), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    with open(args.output, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
