"""FlashInfer's customized modules without a GPU (flare.jit.gen_customize_*_module): FlashInfer's
own FlashSigmoid declaration becomes a flare variant with its scalars, positional arguments map
to them by FlashInfer's order, and what flare cannot run is an error naming it."""

import numpy as np
import pytest

import flare
from flare import _flashinfer_jit

FLASH_SIGMOID = r"""
struct FlashSigmoid : AttentionVariantBase {
  static constexpr bool use_softmax = false;

  uint32_t window_left, qo_len, kv_len;
  float sigmoid_scale_log2;
  float sigmoid_bias_log2;

  // Create closure
  template <typename Params>
  __device__ __host__ FlashSigmoid(const Params& params, uint32_t batch_idx,
                                   uint8_t* smem_ptr) {
    qo_len = params.get_qo_len(batch_idx);
    kv_len = params.get_kv_len(batch_idx);
    window_left = kv_len;
    sigmoid_bias_log2 = params.sigmoid_bias * math::log2e;
    sigmoid_scale_log2 = params.logits_scale * math::log2e;
  }

  REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    return math::ptx_rcp(1.f + math::ptx_exp2(-float(logits * sigmoid_scale_log2 + sigmoid_bias_log2)));
  });
};
"""

JIT_ARGS = ("single_prefill_flash_sigmoid_hd128", "float16", "float16", "float16", 128, 128,
            [], [], ["logits_scale", "sigmoid_bias"], ["double", "double"], "FlashSigmoid",
            FLASH_SIGMOID)


def test_flash_sigmoid_becomes_a_flare_variant():
    module = flare.jit.gen_customize_single_prefill_module("fa2", *JIT_ARGS).build_and_load()
    assert module.kind == "single_prefill" and module.uri == JIT_ARGS[0]
    assert module.variant.name == "FlashSigmoid" and not module.variant.use_softmax
    assert module.variant.scalars == ("logits_scale", "sigmoid_bias")
    assert module.arguments("f", (0.125, 0.25)) == {"logits_scale": 0.125, "sigmoid_bias": 0.25}
    with pytest.raises(TypeError, match=r"takes 2 additional argument\(s\)"):
        module.arguments("f", (0.125,))
    batch = flare.jit.gen_customize_batch_prefill_module(
        "fa2", JIT_ARGS[0], "float16", "float16", "float16", "int32", *JIT_ARGS[4:])
    assert batch.build_and_load().kind == "batch_prefill"


def test_what_flare_cannot_run_is_named():
    with pytest.raises(ValueError, match="backend should not be auto"):
        flare.jit.gen_customize_single_prefill_module("auto", *JIT_ARGS)
    with pytest.raises(NotImplementedError, match="backend 'fa3'"):
        flare.jit.gen_customize_single_prefill_module("fa3", *JIT_ARGS)
    with pytest.raises(NotImplementedError, match=r"\['use_logits_soft_cap'\] beside"):
        flare.jit.gen_customize_single_prefill_module("fa2", *JIT_ARGS, use_logits_soft_cap=True)
    with pytest.raises(NotImplementedError, match="idtype int64"):
        flare.jit.gen_customize_batch_decode_module(
            JIT_ARGS[0], "float16", "float16", "float16", "int64", *JIT_ARGS[4:])
    output = FLASH_SIGMOID.replace(
        "};\n", "REGISTER_OUTPUT_TRANSFORM(params, output, b, q, h, m, d, scale, {})\n};\n")
    with pytest.raises(NotImplementedError, match="defines OutputTransform"):
        flare.jit.gen_customize_single_prefill_module("fa2", *JIT_ARGS[:-1], output)
    with pytest.raises(ValueError, match="tensor mask has dtype 'half'"):
        flare.jit.gen_customize_single_decode_module(
            "u", "float16", "float16", "float16", 128, 128, ["mask"], ["half"], [], [],
            "FlashSigmoid", FLASH_SIGMOID)


def test_wrappers_take_jit_args_and_positional_arguments():
    workspace = np.zeros(1 << 20, dtype=np.uint8)
    jit_args = (JIT_ARGS[0], "float16", "float16", "float16", "int32") + JIT_ARGS[4:]
    with pytest.raises(ValueError, match="backend should not be auto"):
        flare.BatchPrefillWithRaggedKVCacheWrapper(workspace, jit_args=jit_args)
    module = _flashinfer_jit.wrapper_module("batch_prefill", "fa2", jit_args)
    assert module.variant.name == "FlashSigmoid"
    with pytest.raises(ValueError, match="variant= and the wrapper's jit_args both"):
        _flashinfer_jit.plan_variant("plan", module, module.variant)
    assert _flashinfer_jit.run_keywords("run", module, (1.0, 2.0), {}) == {
        "logits_scale": 1.0, "sigmoid_bias": 2.0}
    with pytest.raises(TypeError, match="only with a wrapper built with jit_args"):
        _flashinfer_jit.run_keywords("run", None, (1.0,), {})
    decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace, jit_args=jit_args)
    indptr, indices, last = (np.array(x, dtype=np.int32) for x in ([0, 1], [0], [3]))
    with pytest.raises(ValueError, match="'FlashSigmoid' runs on CUDA tensors only"):
        decode.plan(indptr, indices, last, 8, 8, 128, 16, q_data_type="float16")


def test_flashinfer_utils_names():
    from flare.utils import MaskMode, PosEncodingMode, TensorLayout, get_compute_capability
    assert MaskMode.CAUSAL.value == 1 and MaskMode.CUSTOM.value == 2
    assert PosEncodingMode.ROPE_LLAMA.value == 1 and TensorLayout.HND.value == 1
    assert issubclass(flare.utils.GPUArchitectureError, Exception)
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="must be a cuda device"):
        get_compute_capability("cpu")
