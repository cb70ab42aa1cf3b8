"""How far the cost model's per-layer `act_bytes` is from what autograd really saves.

For each tiny bundled model (and two `hf:` transformers models built from small configs, random
weights, nothing downloaded) this runs one microbatch forward (plus the loss, attributed to the
head) on the CPU with a `torch.autograd.graph.saved_tensors_hooks` pack hook active around the
whole forward. Each layer's forward pre-hook names the layer the hook attributes to, so every
tensor autograd saves is charged to the pipeline layer whose forward saved it.

What counts as saved: the storages of saved tensors, deduplicated by storage pointer within a
layer (`untyped_storage().nbytes()`, i.e. the memory really kept, a view counts its whole
storage), excluding the storages of the model's parameters and buffers. Under autocast the BF16
copies of FP32 weights that autograd saves (autocast's weight casts) are no activations: they
are reported apart (column `wcast`). Under recomputation the tensors a checkpoint keeps from F
(the inputs of a checkpointed module / of the checkpointed attention function) are counted for
the layer holding them; what the checkpoint drops is not seen by the outer hook (its own pack
hook is innermost), which is what recomputation means. The checkpoint's saved RNG state (a few
KB) is not counted.

Modes:
- `bf16`:     the model cast to bfloat16 (weights and activations BF16: what the cost model's
              `activation_bytes=2` assumes), the loss on BF16 logits as `loss(outputs, target)`.
- `autocast`: FP32 weights under `torch.autocast("cpu", bfloat16)`, as `octopipe run --bf16`
              runs a stage's forward and loss (`runtime/step/stage.py`). CPU autocast's op lists
              are not CUDA's (e.g. which ops it runs in FP32), so GPU numbers may differ.

Predicted: `profile_from_config(name, seq_len=256, micro_batch_size=2, tp=1)` (flash attention,
BF16, no dropout: the profile's defaults); for recomputation a layer's `recompute.of(kind)`
(or its plain `act_bytes` where it offers no such kind, as the executor then leaves it alone).
Recomputation is applied as the executor does it (`runtime.model.recompute.apply_recompute`).

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_saved_activations.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

SEQ_LEN, MBS = 256, 2
TOKENS = SEQ_LEN * MBS
BUNDLED = ["tiny-llama", "tiny-moe", "tiny-deepseek", "tiny-gemma", "tiny-hybrid", "tiny-vlm"]

HF_CONFIGS = {
    "hf-llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "hf-qwen3-moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
}


# -- what is predicted --------------------------------------------------------------------------


def predicted(profile, kind: str) -> dict[str, int]:
    out = {}
    for layer in profile.layers:
        alt = layer.recompute.of(kind) if (kind != "none" and layer.recompute) else None
        out[layer.name] = alt.act_bytes if alt is not None else layer.act_bytes
    return out


def arch_profile(arch, **settings):
    from octopipe.costmodel.build import build_profile
    from octopipe.costmodel.hardware import hardware_preset
    from octopipe.costmodel.settings import Settings

    s = Settings(seq_len=SEQ_LEN, micro_batch_size=MBS, **settings)
    return build_profile(arch, hardware_preset("h100"), s)


# -- what is saved ------------------------------------------------------------------------------


class Recorder:
    """Charges every saved tensor's storage to the layer whose forward is running."""

    def __init__(self, model: nn.Module):
        self.current: str | None = None
        self.origin: dict[int, str] = {}  # storage -> the grad_fn of the tensor first saved
        self.saved: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        self.held: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        self.own = {t.untyped_storage().data_ptr() for t in model.parameters()}
        self.own |= {t.untyped_storage().data_ptr() for t in model.buffers()}
        self.params = [p for p in model.parameters() if p.is_floating_point()]

    def _add(self, into, t) -> None:
        if not isinstance(t, torch.Tensor) or self.current is None:
            return
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.own or t.untyped_storage().nbytes() == 0:
            return
        into[self.current].setdefault(ptr, t)
        self.origin.setdefault(ptr, type(t.grad_fn).__name__ if t.grad_fn else "leaf/input")

    def pack(self, t):
        self._add(self.saved, t)
        return t

    def keep(self, tensors) -> None:
        """Tensors a checkpoint holds from F (its inputs)."""
        for t in tensors:
            if isinstance(t, (tuple, list)):
                self.keep(t)
            else:
                self._add(self.held, t)

    def weight_casts(self, tensors: dict[int, torch.Tensor]) -> set[int]:
        """Saved BF16 storages that are copies of an FP32 parameter (autocast's weight casts)."""
        by_numel = defaultdict(list)
        for p in self.params:
            if p.dtype != torch.bfloat16:
                by_numel[p.numel()].append(p)
        found = set()
        for ptr, t in tensors.items():
            st = t.untyped_storage()
            if t.dtype != torch.bfloat16 or st.nbytes() % 2:
                continue
            flat = torch.empty(0, dtype=torch.bfloat16).set_(st).reshape(-1)
            for p in by_numel.get(flat.numel(), ()):
                if torch.equal(flat, p.detach().to(torch.bfloat16).reshape(-1)):
                    found.add(ptr)
                    break
        return found

    def per_layer(self) -> dict[str, tuple[int, int]]:
        """layer -> (activation bytes, weight-cast bytes)."""
        out = {}
        for name in set(self.saved) | set(self.held):
            tensors = {**self.saved[name], **self.held[name]}
            casts = self.weight_casts(tensors)
            act = sum(t.untyped_storage().nbytes() for p, t in tensors.items() if p not in casts)
            wc = sum(t.untyped_storage().nbytes() for p, t in tensors.items() if p in casts)
            out[name] = (act, wc)
        return out


def measure(
    recipe, inputs, target, mode: str, recompute: str, detail: str | None = None
) -> dict[str, tuple[int, int]]:
    from octopipe.runtime.model import hf_attention
    from octopipe.runtime.model.recompute import apply_recompute, recomputed_modules

    stage = recipe.whole(torch.device("cpu"), 0)
    if mode == "bf16":
        stage = stage.to(torch.bfloat16)
        inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    rec = Recorder(stage)
    layers = list(recipe.layers)
    kinds = [recipe.layer_kind(i) for i in range(len(layers))]
    for name in layers:

        def enter(module, args, name=name):
            rec.current = name

        stage.part.get_submodule(name).register_forward_pre_hook(enter)
    # What a checkpoint keeps: the inputs of each module it redoes (the hook is registered
    # before the checkpoint's own, so it sees them as the checkpoint does).
    for module in recomputed_modules(stage.part, layers, kinds, recompute):
        if not hf_attention.routed_attention(module):
            module.register_forward_pre_hook(
                lambda m, a, k: rec.keep([*a, *k.values()]), with_kwargs=True
            )
    apply_recompute(stage, layers, kinds, recompute)
    real_checkpoint = hf_attention.checkpoint

    def recording_checkpoint(fn, *args, **kwargs):  # hf: the attention function's checkpoint
        rec.keep([*args, *kwargs.values()])
        return real_checkpoint(fn, *args, **kwargs)

    hf_attention.checkpoint = recording_checkpoint
    try:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast")
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t), autocast:
            outputs = stage(*inputs)
            loss = recipe.loss(outputs, target)  # charged to the head (the last layer entered)
    finally:
        hf_attention.checkpoint = real_checkpoint
    assert loss.requires_grad
    result = rec.per_layer()
    if detail is not None and detail in rec.saved:
        print(f"-- saved by {detail} ({mode}, recompute {recompute}):")
        tensors = {**rec.saved[detail], **rec.held[detail]}
        casts = rec.weight_casts(tensors)
        for ptr, t in tensors.items():
            what = "weight cast" if ptr in casts else rec.origin.get(ptr, "held by checkpoint")
            if ptr in rec.held[detail] and ptr not in rec.saved[detail]:
                what = "held by checkpoint"
            print(
                f"   {str(tuple(t.shape)):<22}{str(t.dtype)[6:]:<9}"
                f"{t.untyped_storage().nbytes():>10,}  {what}"
            )
    del loss, outputs
    return result


# -- models -------------------------------------------------------------------------------------


def batch(recipe, arch=None):
    gen = torch.Generator().manual_seed(0)
    vocab = arch.vocab_size if arch is not None else recipe.meta_model.config.vocab_size
    tokens = torch.randint(0, vocab, (MBS, SEQ_LEN + 1), generator=gen)
    inputs = (tokens[:, :-1],)
    if arch is not None and arch.vision is not None:
        from octopipe.models.synthetic import pixels

        v = arch.vision
        inputs += (pixels(gen, MBS, v.max_num_tiles, v.num_channels, v.image_size),)
    return inputs, tokens[:, 1:]


def wide_llama():
    """tiny-llama at realistic per-token widths (hidden 1024, 16 heads of 64, GQA 4, MLP 2816),
    2 layers: how the tiny models' width-independent terms (masks, rope tables) shrink."""
    from octopipe.costmodel import load_architecture
    from octopipe.costmodel.arch import AttentionShape

    arch = load_architecture("tiny-llama")
    return replace(
        arch,
        name="wide-llama",
        hidden_size=1024,
        intermediate_size=2816,
        num_layers=2,
        vocab_size=4096,
        attention=AttentionShape(num_heads=16, num_kv_heads=4, head_dim=64),
    )


def cases(quick: bool):
    """(label, family, recipe, inputs, target, {recompute kind: predicted bytes per layer})."""
    from octopipe.api import profile_from_config
    from octopipe.costmodel import load_architecture
    from octopipe.runtime.model.bundled import arch_recipe
    from octopipe.runtime.model.hf import hf_recipe

    for name in BUNDLED if not quick else BUNDLED[:2]:
        arch = load_architecture(name)
        recipe = arch_recipe(arch)
        inputs, target = batch(recipe, arch)
        profile = profile_from_config(name, "h100", seq_len=SEQ_LEN, micro_batch_size=MBS)
        preds = {k: predicted(profile, k) for k in ("none", "selective", "full")}
        yield name, recipe, inputs, target, preds
        if name == "tiny-gemma":  # its softcap runs an unfused core: price that one too
            unfused = arch_profile(arch, attention="unfused")
            preds = {k: predicted(unfused, k) for k in ("none", "selective", "full")}
            yield "tiny-gemma[priced unfused]", None, None, None, preds
    if not quick:
        arch = wide_llama()
        recipe = arch_recipe(arch)
        inputs, target = batch(recipe, arch)
        profile = arch_profile(arch)
        preds = {k: predicted(profile, k) for k in ("none", "selective", "full")}
        yield "wide-llama", recipe, inputs, target, preds
    tmp = Path(tempfile.mkdtemp(prefix="octopipe-saved-"))
    for label, config in HF_CONFIGS.items():
        if quick and label != "hf-llama":
            continue
        path = tmp / label / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(config))
        recipe = hf_recipe(str(path))
        inputs, target = batch(recipe)
        profile = profile_from_config(
            str(path), "h100", seq_len=SEQ_LEN, micro_batch_size=MBS, layer_names="hf"
        )
        preds = {k: predicted(profile, k) for k in ("none", "selective", "full")}
        yield label, recipe, inputs, target, preds


# -- report -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two bundled models and hf-llama")
    parser.add_argument("--modes", default="bf16,autocast")
    parser.add_argument("--recompute", default="none,selective,full")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--detail", help="MODEL:LAYER, e.g. tiny-llama:layers.1: list what that layer saves"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    modes = args.modes.split(",")
    kinds = args.recompute.split(",")
    rows = []
    measured_cache = {}
    failures = []
    for label, recipe, inputs, target, preds in cases(args.quick):
        base = label.split("[")[0]
        for mode in modes:
            for kind in kinds:
                key = (base, mode, kind)
                if recipe is not None:
                    try:
                        want = None
                        if args.detail and args.detail.split(":")[0] == label:
                            want = args.detail.split(":", 1)[1]
                        got = measure(recipe, inputs, target, mode, kind, want)
                        measured_cache[key] = (recipe, got)
                    except RuntimeError as exc:  # e.g. an op CPU autocast leaves mismatched
                        failures.append(f"{label} {mode} {kind}: {str(exc).splitlines()[0]}")
                if key not in measured_cache:
                    continue
                recipe_of, got = measured_cache[key]
                layer_kinds = {n: recipe_of.layer_kind(i) for i, n in enumerate(recipe_of.layers)}
                hf_names = list(recipe_of.layers)
                assert len(hf_names) == len(preds[kind]), (label, len(hf_names))
                # group layers of one kind and one prediction
                groups = defaultdict(list)
                for i, (pname, pbytes) in enumerate(preds[kind].items()):
                    rname = hf_names[i]
                    assert rname == pname, (label, rname, pname)
                    act, wc = got.get(rname, (0, 0))
                    groups[(layer_kinds[rname], pbytes)].append((rname, act, wc))
                for (lkind, pbytes), members in groups.items():
                    act = sum(m[1] for m in members) / len(members)
                    wc = sum(m[2] for m in members) / len(members)
                    rows.append(
                        dict(
                            model=label,
                            mode=mode,
                            recompute=kind,
                            kind=lkind,
                            n=len(members),
                            first=members[0][0],
                            predicted=pbytes,
                            measured=act,
                            lo=min(m[1] for m in members),
                            hi=max(m[1] for m in members),
                            weight_casts=wc,
                            ratio=act / pbytes if pbytes else float("inf"),
                        )
                    )
    elapsed = time.perf_counter() - start

    print(
        f"saved activations per layer, one microbatch: seq_len {SEQ_LEN} x mbs {MBS} "
        f"= {TOKENS} tokens, TP 1, CPU, torch {torch.__version__}"
    )
    header = (
        f"{'model':<27}{'mode':<9}{'rc':<5}{'layer kind':<16}{'n':>2} {'predicted':>10} "
        f"{'measured':>10} {'meas/pred':>9} {'wcast':>8}"
    )
    for mode in modes:
        for kind in kinds:
            sel = [r for r in rows if r["mode"] == mode and r["recompute"] == kind]
            if not sel:
                continue
            print(f"\n== mode {mode}, recompute {kind} ==")
            print(header)
            for r in sel:
                spread = "" if r["lo"] == r["hi"] else f"  [{r['lo']:,}..{r['hi']:,}]"
                print(
                    f"{r['model']:<27}{mode:<9}{kind[:4]:<5}{r['kind'] + '':<16}{r['n']:>2} "
                    f"{r['predicted']:>10,} {int(r['measured']):>10,} {r['ratio']:>9.2f} "
                    f"{int(r['weight_casts']):>8,}{spread}"
                )
    # Signed relative error of the prediction: (predicted - measured) / measured; negative:
    # predicted too low. Per model, over its layer groups weighted by layer count, and totals.
    print(
        "\n== summary: error of predicted vs measured, (pred - meas) / meas, negative = "
        "predicted too low =="
    )
    print(
        f"{'model':<27}{'mode':<9}{'rc':<5}{'mean/layer':>11}{'worst':>9}  {'worst kind':<14}"
        f"{'total pred':>12}{'total meas':>12}{'total err':>10}"
    )
    for mode in modes:
        for kind in kinds:
            by_model = defaultdict(list)
            for r in rows:
                if r["mode"] == mode and r["recompute"] == kind and r["measured"] > 0:
                    by_model[r["model"]].append(r)
            for model, rs in by_model.items():
                errs = [((r["predicted"] - r["measured"]) / r["measured"], r) for r in rs]
                n = sum(r["n"] for r in rs)
                mean = sum(e * r["n"] for e, r in errs) / n
                worst, wr = max(errs, key=lambda x: abs(x[0]))
                tp_ = sum(r["predicted"] * r["n"] for r in rs)
                tm = sum(r["measured"] * r["n"] for r in rs)
                print(
                    f"{model:<27}{mode:<9}{kind[:4]:<5}{mean:>+11.1%}{worst:>+9.1%}  "
                    f"{wr['kind']:<14}{tp_:>12,}{int(tm):>12,}{(tp_ - tm) / tm:>+10.1%}"
                )
    for f in failures:
        print(f"FAILED (not measured): {f}")
    print(f"\n{elapsed:.1f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
