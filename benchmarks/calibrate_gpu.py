"""Measure, on one device, the kernels and layers the analytic cost model prices, so its
predictions can be checked and its efficiency factors calibrated (docs/COSTMODEL.md).

    PYTHONPATH=src python3 benchmarks/calibrate_gpu.py -o measured.json       # a CUDA GPU
    PYTHONPATH=src python benchmarks/calibration_report.py measured.json --hardware h200
    PYTHONPATH=src python benchmarks/calibrate_gpu.py --device cpu --small -o small.json

Needs torch only (`octopipe.models` and `octopipe.costmodel.arch` import nothing else), so a GPU
machine need not hold OctoPipe's other dependencies. Writes measured seconds and bytes as JSON
in the format `octopipe.costmodel.accuracy.load_measurements` reads (docs/COSTMODEL.md).

A layer entry `model/layer@seq` is that layer of OctoPipe's own model of the shipped config
(`octopipe.models.layers.build_layer`), in BF16, eager, one sample of `seq` tokens. The recorded
runs in `src/octopipe/costmodel/measurements/` were taken before this script reused the models,
with plain eager fixtures that differ from them here:

- self-attention: the models project q, k and v apart (the fixture: one fused qkv GEMM), build
  the rope tables in each forward, mask causally with an explicit boolean mask and repeat k/v
  per query group; the fixture called SDPA with `is_causal=True, enable_gqa=True`, which picks
  flash attention on CUDA, where a mask does not;
- gated MLP: separate gate and up GEMMs (the fixture: one fused GEMM); RMSNorm is the models'
  own few elementwise ops (the fixture: `torch.nn.RMSNorm`);
- MLA: the models apply rope to the rope slices (the fixture left it out) and do not pad v to
  the qk head width (the fixture did, for flash SDPA);
- MoE: the models' `MoE` loops over experts, a host sync each, which is readable but not what
  the cost model prices; MoE layers here run `GroupedExperts`: the same router, shared experts
  and expert weights (stacked), the experts as one `torch._grouped_mm` per projection on CUDA
  (as the fixture did; `grouped_gemm` in the output says whether it ran), else a loop. The
  router's softmax runs in BF16 as in the models (the fixture: FP32);
- output: the models' head (with Gemma-2's logit soft cap, which the fixture lacked), then the
  cross-entropy on FP32 logits, as the fixture did (`ArchModel.loss` takes them as they come);
- cross-attention and vision blocks: k/v projected apart, k/v repeated per group.

Kernels (a GEMM, a device copy, causal GQA SDPA) are hardware measurements, no model block:
SDPA runs with `is_causal=True` there, the flash kernel the attention efficiency is fitted to.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.costmodel.arch import Architecture, LayerSpec, layer_specs
from octopipe.costmodel.hf_config import load_architecture
from octopipe.models.feedforward import MoE
from octopipe.models.layers import build_layer

DTYPE = torch.bfloat16
NEW_MODELS = ("mixtral-8x7b", "deepseek-v2-lite", "llama3.2-11b-vision")
FULL_LAYERS = (
    "llama3-8b/layers.0@4096",
    "llama3-8b/layers.0@8192",
    "llama3-70b/layers.0@4096",
    "llama3-8b/output@4096",
    "gemma2-9b/output@4096",
    "gemma2-9b/tok_embeddings@4096",
    "mixtral-8x7b/layers.0@4096",
    "deepseek-v2-lite/layers.1@4096",
    "llama3.2-11b-vision/layers.3@4096",
    "llama3.2-11b-vision/vision.layers.0@4096",
)
SMALL_LAYERS = (  # the same kinds of layer, of the tiny configs: checks that every case runs
    "tiny-llama/layers.0@64",
    "tiny-llama/output@64",
    "tiny-gemma/tok_embeddings@64",
    "tiny-moe/layers.1@64",
    "tiny-deepseek/layers.1@64",
    "tiny-vlm/layers.1@64",
    "tiny-vlm/vision.layers.1@64",
    "tiny-hybrid/layers.0@64",
)
FULL_BREAKDOWN, SMALL_BREAKDOWN = "deepseek-v2-lite/layers.1@4096", "tiny-deepseek/layers.1@64"


@dataclass
class Clock:
    """Median seconds of a callable: CUDA events on a GPU, wall clock on the CPU."""

    device: str
    warmup: int = 3
    repeats: int = 10

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.repeats):
            if self.device == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


class GroupedExperts(nn.Module):
    """A models' `MoE` with its experts' weights stacked, [experts, in, out] per projection, and
    run as grouped GEMMs (`torch._grouped_mm`) when `grouped`, else one GEMM per expert. Router,
    shared experts and their gate are the MoE's own modules; the output is the MoE's."""

    def __init__(self, moe: MoE, grouped: bool):
        super().__init__()
        self.top_k, self.normalize_top_k, self.grouped = moe.top_k, moe.normalize_top_k, grouped
        self.router, self.shared, self.shared_gate = moe.router, moe.shared, moe.shared_gate
        experts = list(moe.experts)
        self.act = experts[0].act
        with torch.no_grad():
            gate_up = [torch.cat([e.w_gate.weight, e.w_up.weight]).T for e in experts]
            self.gate_up = nn.Parameter(torch.stack(gate_up))
            self.down = nn.Parameter(torch.stack([e.w_down.weight.T for e in experts]))

    def project(self, tokens: torch.Tensor, counts: torch.Tensor, weight: torch.Tensor):
        """tokens (sorted by expert, `counts` per expert) times each expert's `weight`."""
        if self.grouped:
            return torch._grouped_mm(tokens, weight, offs=counts.cumsum(0).to(torch.int32))
        chunks = tokens.split(counts.tolist())
        return torch.cat([chunk @ weight[e] for e, chunk in enumerate(chunks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(tokens).softmax(-1).topk(self.top_k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        order = chosen.flatten().argsort()
        counts = torch.bincount(chosen.flatten(), minlength=self.gate_up.shape[0])
        routed = tokens.repeat_interleave(self.top_k, 0)[order]
        gate, up = self.project(routed, counts, self.gate_up).chunk(2, dim=-1)
        routed = self.project(self.act(gate) * up, counts, self.down)
        routed = routed[order.argsort()].view(-1, self.top_k, tokens.shape[-1])
        out = (routed * weights.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_gate is not None:
                shared = shared * torch.sigmoid(self.shared_gate(tokens))
            out = out + shared
        return out.view_as(x)


@dataclass
class LayerCase:
    """One layer to measure: `call(*inputs)` gives the tensor whose backward is timed; the
    `inputs` get gradients (I), the `constants` (token ids, targets) none."""

    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    constants: tuple[torch.Tensor, ...]
    call: Callable[..., torch.Tensor]


def hidden_states(tokens: int, width: int, device: str) -> torch.Tensor:
    return torch.randn(1, tokens, width, device=device, dtype=DTYPE)


def layer_case(arch: Architecture, spec: LayerSpec, seq: int, device: str) -> LayerCase:
    """The models' layer for `spec`, on `device` in BF16, with inputs of one `seq`-token sample
    (and one image, for the vision-language layers)."""
    with torch.device(device):
        module = build_layer(arch, spec)
    if isinstance(getattr(module, "ffn", None), MoE):
        grouped = device == "cuda" and hasattr(torch, "_grouped_mm")
        module.ffn = GroupedExperts(module.ffn, grouped)
    module = module.to(DTYPE)
    h = hidden_states(seq, arch.hidden_size, device)
    ids = torch.randint(0, arch.vocab_size, (1, seq), device=device)
    if spec.kind == "embedding":
        return LayerCase(module, (), (ids,), lambda: module(ids)[0])
    if spec.kind == "head":

        def loss(x: torch.Tensor) -> torch.Tensor:
            logits = module(x)[0].float()
            return F.cross_entropy(logits.flatten(0, 1), ids.flatten())

        return LayerCase(module, (h,), (ids,), loss)
    if spec.kind == "cross_attention":
        assert arch.vision is not None
        image = hidden_states(arch.vision.num_tokens, arch.hidden_size, device)
        return LayerCase(module, (h, image), (), lambda x, img: module(x, img)[0])
    if spec.kind == "vision_block":
        v = arch.vision
        assert v is not None
        states = hidden_states(v.num_tokens, v.hidden_size, device)
        # The features earlier layers collected travel as one stream, their widths side by side.
        collected = sum(1 for i in v.intermediate_layers if i < spec.index)
        inputs = (states,)
        if collected:
            inputs += (hidden_states(v.num_tokens, collected * v.hidden_size, device),)
        return LayerCase(module, inputs, (ids,), lambda *x: module(ids, *x)[1])
    if spec.kind in ("decoder", "moe", "mamba", "attention", "mlp", "norm"):
        return LayerCase(module, (h,), (), lambda x: module(x)[0])
    raise ValueError(f"{arch.name}/{spec.name}: layers of kind {spec.kind!r} are not measured")


def saved_bytes(run: Callable[[], object], exclude: set[int]) -> int:
    """Bytes of distinct storages autograd saves during `run`, those in `exclude` left out."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def measure_layer(case: LayerCase, clock: Clock) -> dict[str, float]:
    """F, I (gradients of the inputs only), B (full backward) and W = B - I of one layer, and
    the bytes autograd saves (parameters, buffers and constants left out). A layer without
    inputs that take gradients (the embedding) has I = 0 and W = B, and no saved bytes."""
    inputs = tuple(t.detach().requires_grad_(True) for t in case.inputs)
    params = list(case.module.parameters())

    def forward() -> torch.Tensor:
        return case.call(*inputs)

    def backward(wrt: Sequence[torch.Tensor]) -> None:
        torch.autograd.grad(forward(), wrt, grad, allow_unused=True)

    out = forward()
    grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
    f = clock(forward)
    fb = clock(lambda: backward([*inputs, *params]))
    if not inputs:
        return {"f": f, "i": 0.0, "b": fb - f, "w": fb - f}
    fi = clock(lambda: backward(inputs))
    held = [*params, *case.module.buffers(), *case.constants]
    act = saved_bytes(forward, {t.untyped_storage().data_ptr() for t in held})
    return {"f": f, "i": fi - f, "b": fb - f, "w": fb - fi, "act_bytes": act}


def split_name(name: str) -> tuple[Architecture, LayerSpec, int]:
    """`model/layer@seq` -> the shipped architecture, its layer spec and the sequence length."""
    model, _, rest = name.partition("/")
    layer, _, seq = rest.partition("@")
    arch = load_architecture(model)
    spec = next((s for s in layer_specs(arch) if s.name == layer), None)
    if spec is None or not seq.isdigit():
        raise ValueError(f"{name}: expected model/layer@seq_len with a layer of {model}")
    return arch, spec, int(seq)


def measure_named_layer(name: str, clock: Clock) -> dict:
    arch, spec, seq = split_name(name)
    case = layer_case(arch, spec, seq, clock.device)
    result: dict = measure_layer(case, clock)
    if isinstance(getattr(case.module, "ffn", None), GroupedExperts):
        result["grouped_gemm"] = case.module.ffn.grouped
    return result


def moe_breakdown(name: str, clock: Clock) -> dict:
    """An MLA + MoE layer's parts: the attention alone, the MoE alone, and the experts' gate/up
    projection as one grouped GEMM (tokens spread evenly) against a dense GEMM of the same
    FLOPs (where is the time?)."""
    arch, spec, seq = split_name(name)
    case = layer_case(arch, spec, seq, clock.device)
    mixer, moe = case.module.mixer, case.module.ffn
    assert isinstance(moe, GroupedExperts), f"{name} has no MoE"
    x = hidden_states(seq, arch.hidden_size, clock.device)
    out = {
        "mla": measure_layer(LayerCase(mixer, (x,), (), mixer), clock),
        "moe": measure_layer(LayerCase(moe, (x,), (), moe), clock),
    }
    experts, dim, width = moe.gate_up.shape
    per_expert = seq * moe.top_k // experts
    tokens = torch.randn(per_expert * experts, dim, device=clock.device, dtype=DTYPE)
    counts = torch.full((experts,), per_expert, device=clock.device)
    dense = torch.randn(dim, width, device=clock.device, dtype=DTYPE)
    out["grouped_gate_up_f"] = clock(lambda: moe.project(tokens, counts, moe.gate_up))
    out["dense_gate_up_f"] = clock(lambda: tokens @ dense)
    out["gate_up_flops"] = 2.0 * tokens.shape[0] * dim * width
    return out


def kernels(clock: Clock, small: bool) -> dict:
    """An n^3 BF16 GEMM's FLOP/s, a device copy's bytes/s and causal GQA SDPA."""
    device = clock.device
    n = 256 if small else 8192
    a = torch.randn(n, n, device=device, dtype=DTYPE)
    b = torch.randn(n, n, device=device, dtype=DTYPE)
    gemm = 2 * n**3 / clock(lambda: a @ b)
    size = (1 << 18) if small else (1 << 30)  # elements of bf16: 2 GiB read + 2 GiB written
    src = torch.empty(size, device=device, dtype=DTYPE)
    dst = torch.empty_like(src)
    copy = 2 * src.nbytes / clock(lambda: dst.copy_(src))
    out: dict = {"gemm_flops": gemm, "copy_bytes_per_s": copy}
    for seq in (128,) if small else (4096, 16384):
        out[f"attention_{seq}"] = causal_attention(seq, clock)
    return out


def causal_attention(seq: int, clock: Clock) -> dict[str, float]:
    """Causal GQA SDPA, 32 query and 8 KV heads of 128: forward and backward seconds."""
    shape = dict(device=clock.device, dtype=DTYPE, requires_grad=True)
    q = torch.randn(1, 32, seq, 128, **shape)
    k = torch.randn(1, 8, seq, 128, **shape)
    v = torch.randn(1, 8, seq, 128, **shape)
    flops = 2 * seq * (seq + 1) / 2 * 32 * 256  # causal: QK^T and PV over attended keys

    def attend() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    grad = torch.randn_like(attend())
    forward = clock(attend)
    both = clock(lambda: torch.autograd.grad(attend(), [q, k, v], grad))
    return {"f": forward, "b": both - forward, "f_flops": flops}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to measure (default: cuda when there is one)",
    )
    parser.add_argument(
        "--small", action="store_true", help="tiny shapes (the tiny-* configs): check the script"
    )
    parser.add_argument(
        "--layers", nargs="+", metavar="MODEL/LAYER@SEQ", help="measure these layers instead"
    )
    parser.add_argument(
        "--only-new",
        action="store_true",
        help="only the MoE, MLA, cross-attention and vision layers",
    )
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument(
        "--breakdown", action="store_true", help="only the DeepSeek-V2-Lite MoE layer's parts"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each timing")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs (the median counts)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    clock = Clock(args.device, args.warmup, args.repeats)
    torch.manual_seed(0)
    results: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    if not args.skip_kernels:
        results["kernels"] = kernels(clock, args.small)
        print(json.dumps(results["kernels"]), flush=True)
    names = args.layers or (SMALL_LAYERS if args.small else FULL_LAYERS)
    if args.only_new:
        names = [name for name in names if name.split("/")[0] in NEW_MODELS]
    if args.breakdown:
        target = SMALL_BREAKDOWN if args.small else FULL_BREAKDOWN
        results["breakdown"] = moe_breakdown(target, clock)
        print(json.dumps(results["breakdown"]), flush=True)
        names = []
    results["layers"] = {}
    for name in names:
        results["layers"][name] = measure_named_layer(name, clock)
        print(name, json.dumps(results["layers"][name]), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    results["date"] = datetime.date.today().isoformat()
    results["command"] = " ".join(["python3", "benchmarks/calibrate_gpu.py", *argv])
    with open(args.output, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
