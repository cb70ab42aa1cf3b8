"""FP8 training in the cost model: which GEMMs move to the FP8 tensor cores, what stays BF16,
the casts and scaling passes, the FP8 copies in memory, and GPUs without FP8 refused."""

from __future__ import annotations

import pytest

from octopipe.costmodel import layer_specs, load_architecture
from octopipe.costmodel.build import estimate_layers
from octopipe.costmodel.hardware import hardware_preset
from octopipe.costmodel.kernels import ATTENTION, MATMUL, MEMORY
from octopipe.costmodel.layercost import layer_work
from octopipe.costmodel.precision import cast_bytes, check_precision, weight_cache_bytes
from octopipe.costmodel.settings import Settings
from octopipe.errors import InputError
from octopipe.layouts.costs import optimizer_seconds

H100 = hardware_preset("h100")


def _layers(precision: str, **kw):
    arch = load_architecture("llama3-8b")
    settings = Settings(seq_len=4096, precision=precision, **kw)
    return {e.spec.name: e for e in estimate_layers(arch, H100, settings)}


def _work(name: str, precision: str, scaling: str = "delayed"):
    arch = load_architecture("llama3-8b")
    spec = next(s for s in layer_specs(arch) if s.name == name)
    return layer_work(arch, spec, Settings(seq_len=4096, precision=precision, fp8_scaling=scaling))


def test_fp8_moves_the_blocks_gemms_and_leaves_attention_head_and_norms_bf16():
    bf16, fp8 = _work("layers.0", "bf16"), _work("layers.0", "fp8")
    gemms = [k for k in fp8.kernels if k.unit == MATMUL]
    assert gemms and all(k.fp8 for k in gemms)
    attention = [k for k in fp8.kernels if k.unit == ATTENTION]
    assert attention == [k for k in bf16.kernels if k.unit == ATTENTION]
    assert not any(k.fp8 for k in _work("output", "fp8").kernels)
    assert _work("norm", "fp8").kernels == _work("norm", "bf16").kernels
    # Same FLOPs; the block runs faster, the head at the same speed.
    assert fp8.model_flops() == pytest.approx(bf16.model_flops())
    b, f = _layers("bf16"), _layers("fp8")
    assert f["layers.0"].f < 0.8 * b["layers.0"].f
    assert f["output"].f == pytest.approx(b["output"].f)


def test_fp8_linears_add_casts_and_current_scaling_reads_once_more():
    bf16 = sum(k.bytes for k in _work("layers.0", "bf16").kernels if k.unit == MEMORY)
    delayed = sum(k.bytes for k in _work("layers.0", "fp8").kernels if k.unit == MEMORY)
    current = sum(k.bytes for k in _work("layers.0", "fp8", "current").kernels if k.unit == MEMORY)
    assert bf16 < delayed < current
    n = 1000.0
    assert cast_bytes(n, 2, "fp8", "delayed") == 2 * n + 2 * n  # read BF16, write FP8 and its T
    assert cast_bytes(n, 2, "fp8", "current") == 4 * n + 2 * n  # plus the amax pass
    assert cast_bytes(n, 2, "mxfp8", "delayed") == 2 * n + 2 * n + 2 * n / 32  # and scales


def test_casts_fused_into_the_norm_and_activation_cost_the_forward_nothing():
    # Llama-3-8B's block: Transformer Engine fuses the casts of q/k/v's and the MLP's inputs
    # into the norms and the activation; only the attention output casts on its own in F.
    def forward_memory(precision: str) -> float:
        work = _work("layers.0", precision)
        return sum(k.bytes for k in work.kernels if k.unit == MEMORY and k.phase == "f")

    tokens, width = 4096, 32 * 128  # the o-projection's input: every head's output
    extra = forward_memory("fp8") - forward_memory("bf16")
    assert extra == pytest.approx(cast_bytes(tokens * width, 2, "fp8", "delayed"))


def test_fp8_keeps_fp8_inputs_and_fp8_weight_copies():
    b, f = _layers("bf16")["layers.0"], _layers("fp8")["layers.0"]
    assert f.fp8_params == f.params - 2 * 4096  # every weight but the two norms'
    assert f.param_bytes == b.param_bytes + 2 * f.fp8_params  # FP8 weight and its transpose
    assert weight_cache_bytes("mxfp8") > weight_cache_bytes("fp8") > weight_cache_bytes("bf16")
    # The linear inputs W needs are held in FP8: half their BF16 bytes.
    assert f.wact_bytes == pytest.approx(b.wact_bytes / 2, rel=1e-6)
    assert b.act_bytes - f.act_bytes == pytest.approx(b.wact_bytes / 2, rel=1e-6)


def test_the_step_casts_the_fp8_weights_once():
    params = 1e9
    plain = optimizer_seconds(params, 4, 2, H100)
    fp8 = optimizer_seconds(params, 4, 2, H100, fp8_params=params, precision="fp8")
    bandwidth = H100.memory_bandwidth * H100.memory_efficiency
    assert fp8 - plain == pytest.approx(params * (2 + 2) / bandwidth)


@pytest.mark.parametrize(
    ("precision", "gpu", "says"),
    [("fp8", "a100", "no FP8 tensor cores"), ("mxfp8", "h100", "block-scaled")],
)
def test_gpus_without_the_precision_are_refused_in_one_line(precision, gpu, says):
    with pytest.raises(InputError, match=says):
        check_precision(precision, hardware_preset(gpu))
    with pytest.raises(InputError):
        Settings(precision="fp4")


def test_blackwell_presets_take_mxfp8_and_gb200_spans_72_gpus_of_nvlink(capsys):
    import json

    from octopipe.cli import main

    for gpu in ("b200", "gb200"):
        hw = hardware_preset(gpu)
        check_precision("mxfp8", hw)
        assert hw.fp8_peak_flops == 2 * hw.peak_flops  # datasheets: FP8 twice BF16
    argv = ["estimate", "--model", "llama3-8b", "--hardware", "gb200", "--gpus", "72"]
    argv += ["--tp", "8", "--global-batch", "9", "--seq-len", "1024", "--json"]
    assert main(argv) == 0
    nvl72 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*argv, "--gpus-per-node", "8"]) == 0
    nodes = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # One NVLink domain: the DP ring runs over NVLink 5, not the NICs of 8-GPU nodes.
    assert nvl72["breakdown"]["dp_exposed"] < nodes["breakdown"]["dp_exposed"] / 10


def test_profile_arch_writes_an_fp8_profile_of_the_same_layers(tmp_path):
    from octopipe.cli import main
    from octopipe.profile import load_profile

    paths = {}
    for precision in ("bf16", "fp8"):
        paths[precision] = tmp_path / f"{precision}.json"
        argv = ["profile-arch", "llama3-8b", "--hardware", "h100", "--tp", "2"]
        argv += ["--layer-names", "hf", "--precision", precision, "-o", str(paths[precision])]
        assert main(argv) == 0
    bf16, fp8 = (load_profile(paths[p]) for p in ("bf16", "fp8"))
    assert [layer.name for layer in fp8.layers] == [layer.name for layer in bf16.layers]
    assert fp8.layers[1].name == "model.layers.0"
    assert fp8.layers[1].f < bf16.layers[1].f
    assert fp8.layers[1].param_bytes > bf16.layers[1].param_bytes  # the FP8 weight copies
    assert fp8.layers[-1].f == pytest.approx(bf16.layers[-1].f)  # the head stays BF16
