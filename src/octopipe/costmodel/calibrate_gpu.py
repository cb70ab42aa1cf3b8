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
NEW_MODELS = ("mixtral-8x7b", "deepseek-v2-lite", "llama3.2-11b-vision")


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


def rope_tables(seq: int, dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.outer(
        torch.arange(seq, device=device).float(),
        1e-4 ** (torch.arange(0, dim, 2, device=device).float() / dim),
    )
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(DTYPE), angles.sin().to(DTYPE)


class GQA(nn.Module):
    """Grouped-query self-attention with rope and causal SDPA."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, seq: int, device):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.cos, self.sin = rope_tables(seq, head_dim, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], -1)
        q = rotate(q.view(b, s, self.heads, d).transpose(1, 2), self.cos, self.sin)
        k = rotate(k.view(b, s, self.kv_heads, d).transpose(1, 2), self.cos, self.sin)
        v = v.view(b, s, self.kv_heads, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(b, s, self.heads * d))


class LatentAttention(nn.Module):
    """DeepSeek-V2-Lite MLA (no query compression); v padded to the qk width for flash SDPA,
    as common implementations do; rope rotation left out (small and memory-bound)."""

    def __init__(self, hidden: int, heads: int, kv_rank: int, nope: int, rope: int, v_dim: int):
        super().__init__()
        self.heads, self.kv_rank, self.nope, self.rope, self.v_dim = (
            heads,
            kv_rank,
            nope,
            rope,
            v_dim,
        )
        self.q = nn.Linear(hidden, heads * (nope + rope), bias=False)
        self.kv_down = nn.Linear(hidden, kv_rank + rope, bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank)
        self.kv_up = nn.Linear(kv_rank, heads * (nope + v_dim), bias=False)
        self.o = nn.Linear(heads * v_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.heads
        q = self.q(x).view(b, s, h, -1).transpose(1, 2)
        latent, k_rope = self.kv_down(x).split([self.kv_rank, self.rope], -1)
        kv = self.kv_up(self.kv_norm(latent)).view(b, s, h, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], -1)
        k = torch.cat((k_nope, k_rope.view(b, 1, s, self.rope).expand(b, h, s, self.rope)), -1)
        v = F.pad(v, (0, q.shape[-1] - self.v_dim))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., : self.v_dim]
        return self.o(a.transpose(1, 2).reshape(b, s, h * self.v_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts as grouped GEMMs (torch._grouped_mm where it runs, else a
    loop over experts), plus optional shared experts."""

    def __init__(self, hidden: int, experts: int, top_k: int, ffn: int, shared_ffn: int):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate_up = nn.Parameter(torch.randn(experts, hidden, 2 * ffn) * hidden**-0.5)
        self.down = nn.Parameter(torch.randn(experts, ffn, hidden) * ffn**-0.5)
        self.shared = SwiGLU(hidden, shared_ffn) if shared_ffn else None
        self.grouped = hasattr(torch, "_grouped_mm")

    def _experts(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            offsets = counts.cumsum(0).to(torch.int32)
            gate, up = torch._grouped_mm(tokens, self.gate_up, offs=offsets).chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(gate) * up, self.down, offs=offsets)
        outs = []
        for e, chunk in enumerate(tokens.split(counts.tolist())):
            gate, up = (chunk @ self.gate_up[e]).chunk(2, dim=-1)
            outs.append((F.silu(gate) * up) @ self.down[e])
        return torch.cat(outs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        weights, chosen = self.router(flat).float().softmax(-1).topk(self.top_k, dim=-1)
        order = chosen.view(-1).argsort()
        counts = torch.bincount(chosen.view(-1), minlength=self.experts)
        routed = self._experts(flat.repeat_interleave(self.top_k, 0)[order], counts)
        routed = routed[order.argsort()].view(-1, self.top_k, h)
        out = (routed * weights.unsqueeze(-1).to(x.dtype)).sum(1)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view(b, s, h)


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, hidden: int, mixer: nn.Module, ffn: nn.Module):
        super().__init__()
        self.mixer_norm, self.mixer = nn.RMSNorm(hidden), mixer
        self.ffn_norm, self.ffn = nn.RMSNorm(hidden), ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class CrossAttentionBlock(nn.Module):
    """Mllama cross-attention layer: text queries, image keys/values, q/k norms, full SDPA,
    tanh-gated residuals around attention and the SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        d = self.head_dim
        self.norm = nn.RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * d, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * d, bias=False)
        self.q_norm, self.k_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.o = nn.Linear(heads * d, hidden, bias=False)
        self.attn_gate = nn.Parameter(torch.ones(1))
        self.mlp_norm, self.mlp = nn.RMSNorm(hidden), SwiGLU(hidden, ffn)
        self.mlp_gate = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        n, d = image.shape[1], self.head_dim
        q = self.q_norm(self.q(self.norm(x)).view(b, s, self.heads, d)).transpose(1, 2)
        k, v = self.kv(image).view(b, n, 2 * self.kv_heads, d).chunk(2, dim=2)
        k, v = self.k_norm(k).transpose(1, 2), v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        x = x + self.attn_gate.tanh() * self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp_gate.tanh() * self.mlp(self.mlp_norm(x))


class VisionBlock(nn.Module):
    """ViT block over all tiles of one image: LayerNorm, full SDPA, LayerNorm, GELU MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, n, 3, self.heads, -1).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.o(a.transpose(1, 2).reshape(b, n, h))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x))))


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


def measure_layer(
    module: nn.Module, inputs: tuple[torch.Tensor, ...], constants: tuple[torch.Tensor, ...] = ()
) -> dict[str, float]:
    """F, I (gradients of `inputs` only), B (full backward) and W = B - I of one layer, and
    the bytes autograd saves. `constants` (targets, tables) need no gradient."""
    inputs = tuple(t.detach().requires_grad_(True) for t in inputs)
    params = [p for p in module.parameters()]

    def forward() -> torch.Tensor:
        return module(*inputs, *constants)

    out = forward()
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
    f = timed(forward)
    fi = timed(lambda: torch.autograd.grad(forward(), inputs, grad))
    fb = timed(lambda: torch.autograd.grad(forward(), [*inputs, *params], grad))
    exclude = {t.untyped_storage().data_ptr() for t in [*params, *constants]}
    for buffer in module.buffers():
        exclude.add(buffer.untyped_storage().data_ptr())
    for value in vars(module).values():  # plain tensor attributes (rope tables)
        if isinstance(value, torch.Tensor):
            exclude.add(value.untyped_storage().data_ptr())
    act = saved_bytes(forward, exclude)
    return {"f": f, "i": fi - f, "b": fb - f, "w": fb - fi, "act_bytes": act}


def hidden_states(tokens: int, hidden: int, device: str) -> torch.Tensor:
    return torch.randn(1, tokens, hidden, device=device, dtype=DTYPE)


def llama_layer(hidden: int, heads: int, kv: int, ffn: int, seq: int, device: str) -> dict:
    d = hidden // heads
    block = Block(hidden, GQA(hidden, heads, kv, d, seq, device), SwiGLU(hidden, ffn))
    block = block.to(device, DTYPE)
    return measure_layer(block, (hidden_states(seq, hidden, device),))


def mixtral_layer(seq: int, device: str) -> dict:
    block = Block(4096, GQA(4096, 32, 8, 128, seq, device), MoE(4096, 8, 2, 14336, 0))
    result = measure_layer(block.to(device, DTYPE), (hidden_states(seq, 4096, device),))
    return {**result, "grouped_gemm": block.ffn.grouped}


def deepseek_v2_lite_moe_layer(seq: int, device: str) -> dict:
    mla = LatentAttention(2048, 16, 512, 128, 64, 128)
    block = Block(2048, mla, MoE(2048, 64, 6, 1408, 2 * 1408))
    result = measure_layer(block.to(device, DTYPE), (hidden_states(seq, 2048, device),))
    return {**result, "grouped_gemm": block.ffn.grouped}


def mllama_cross_attention_layer(seq: int, image_tokens: int, device: str) -> dict:
    block = CrossAttentionBlock(4096, 32, 8, 14336).to(device, DTYPE)
    inputs = (hidden_states(seq, 4096, device), hidden_states(image_tokens, 4096, device))
    return measure_layer(block, inputs)


def mllama_vision_layer(image_tokens: int, device: str) -> dict:
    block = VisionBlock(1280, 16, 5120).to(device, DTYPE)
    return measure_layer(block, (hidden_states(image_tokens, 1280, device),))


def moe_breakdown(seq: int, device: str) -> dict:
    """DeepSeek-V2-Lite layer parts: MLA alone, MoE alone, and the experts' gate/up projection
    as one grouped GEMM against a dense GEMM of the same FLOPs (where is the time?)."""
    x = hidden_states(seq, 2048, device)
    mla = LatentAttention(2048, 16, 512, 128, 64, 128).to(device, DTYPE)
    moe = MoE(2048, 64, 6, 1408, 2 * 1408).to(device, DTYPE)
    tokens = torch.randn(seq * 6, 2048, device=device, dtype=DTYPE)
    counts = torch.full((64,), seq * 6 // 64, device=device)
    offsets = counts.cumsum(0).to(torch.int32)
    dense = torch.randn(2048, 2 * 1408, device=device, dtype=DTYPE)
    out = {"mla": measure_layer(mla, (x,)), "moe": measure_layer(moe, (x,))}
    out["grouped_gate_up_f"] = timed(lambda: torch._grouped_mm(tokens, moe.gate_up, offs=offsets))
    out["dense_gate_up_f"] = timed(lambda: tokens @ dense)
    out["gate_up_flops"] = 2.0 * tokens.shape[0] * 2048 * 2 * 1408
    return out


def head_layer(hidden: int, vocab: int, seq: int, device: str) -> dict:
    head = Head(hidden, vocab).to(device, DTYPE)
    target = torch.randint(0, vocab, (1, seq), device=device)
    return measure_layer(head, (hidden_states(seq, hidden, device),), (target,))


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
    for seq in (256,) if small else (4096, 16384):
        out[f"attention_{seq}"] = causal_attention(seq, device)
    return out


def causal_attention(seq: int, device: str) -> dict[str, float]:
    """Causal GQA SDPA, 32 query and 8 KV heads of 128: forward and backward seconds."""
    q = torch.randn(1, 32, seq, 128, device=device, dtype=DTYPE, requires_grad=True)
    k = torch.randn(1, 8, seq, 128, device=device, dtype=DTYPE, requires_grad=True)
    v = torch.randn(1, 8, seq, 128, device=device, dtype=DTYPE, requires_grad=True)
    flops = 2 * seq * (seq + 1) / 2 * 32 * 256  # causal: QK^T and PV over attended keys

    def attend() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    grad = torch.randn_like(attend())
    forward = timed(attend)
    both = timed(lambda: torch.autograd.grad(attend(), [q, k, v], grad))
    return {"f": forward, "b": both - forward, "f_flops": flops}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--small", action="store_true", help="tiny shapes: check the script")
    parser.add_argument(
        "--only-new",
        action="store_true",
        help="only the MoE, MLA, cross-attention and vision layers",
    )
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument(
        "--breakdown", action="store_true", help="only the DeepSeek-V2-Lite MoE layer's parts"
    )
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    results: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if not args.skip_kernels:
        results["kernels"] = kernels(device, args.small)
        print(json.dumps(results["kernels"]), flush=True)
    # (name, profile layer, builder args); shapes from the shipped configs.
    if args.small:  # wrong shapes for the names: only checks that every fixture runs
        layers = {
            "llama3-8b/layers.0@256": lambda: llama_layer(256, 4, 2, 512, 256, device),
            "mixtral-8x7b/layers.0@64": lambda: {
                "ok": bool(
                    measure_layer(
                        Block(64, GQA(64, 4, 2, 16, 64, device), MoE(64, 4, 2, 32, 32)).to(
                            device, DTYPE
                        ),
                        (hidden_states(64, 64, device),),
                    )
                )
            },
            "deepseek-v2-lite/layers.1@64": lambda: {
                "ok": bool(
                    measure_layer(
                        Block(64, LatentAttention(64, 4, 32, 16, 16, 16), MoE(64, 4, 2, 32, 0)).to(
                            device, DTYPE
                        ),
                        (hidden_states(64, 64, device),),
                    )
                )
            },
            "cross@64": lambda: {
                "ok": bool(
                    measure_layer(
                        CrossAttentionBlock(64, 4, 2, 128).to(device, DTYPE),
                        (hidden_states(64, 64, device), hidden_states(80, 64, device)),
                    )
                )
            },
            "vision@64": lambda: {
                "ok": bool(
                    measure_layer(
                        VisionBlock(64, 4, 128).to(device, DTYPE), (hidden_states(80, 64, device),)
                    )
                )
            },
            "gemma2-9b/output@256": lambda: head_layer(256, 4096, 256, device),
            "gemma2-9b/tok_embeddings@256": lambda: embedding_layer(256, 4096, 256, device),
        }
    else:
        image_tokens = 4 * ((560 // 14) ** 2 + 1)  # Llama-3.2-Vision: 4 tiles of 1600 + 1
        layers = {
            "llama3-8b/layers.0@4096": lambda: llama_layer(4096, 32, 8, 14336, 4096, device),
            "llama3-8b/layers.0@8192": lambda: llama_layer(4096, 32, 8, 14336, 8192, device),
            "llama3-70b/layers.0@4096": lambda: llama_layer(8192, 64, 8, 28672, 4096, device),
            "llama3-8b/output@4096": lambda: head_layer(4096, 128256, 4096, device),
            "gemma2-9b/output@4096": lambda: head_layer(3584, 256000, 4096, device),
            "gemma2-9b/tok_embeddings@4096": lambda: embedding_layer(3584, 256000, 4096, device),
            "mixtral-8x7b/layers.0@4096": lambda: mixtral_layer(4096, device),
            "deepseek-v2-lite/layers.1@4096": lambda: deepseek_v2_lite_moe_layer(4096, device),
            "llama3.2-11b-vision/layers.3@4096": lambda: mllama_cross_attention_layer(
                4096, image_tokens, device
            ),
            "llama3.2-11b-vision/vision.layers.0@4096": lambda: mllama_vision_layer(
                image_tokens, device
            ),
        }
        if args.only_new:
            layers = {k: v for k, v in layers.items() if k.split("/")[0] in NEW_MODELS}
    if args.breakdown:
        results["breakdown"] = moe_breakdown(256 if args.small else 4096, device)
        print(json.dumps(results["breakdown"]), flush=True)
        layers = {}
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
