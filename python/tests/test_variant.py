"""flare.AttentionVariant without a GPU: its declaration is validated, the CPU backend refuses
it (it cannot run CUDA source), and run() keywords beyond FlashInfer's are errors without a
planned variant."""

import numpy as np
import pytest

import flare

SOURCE = "struct Variant : flare::VariantBase {};"


def test_declarations_are_validated():
    v = flare.AttentionVariant(SOURCE, "plain", scalars=("a", "b"))
    assert v.scalars == ("a", "b") and v.name == "plain"
    assert flare.AttentionVariant(SOURCE, "one", scalars="a").scalars == ("a",)
    assert v.use_softmax and "use_softmax" not in repr(v)
    sigmoid = flare.AttentionVariant(SOURCE, "sig", use_softmax=False)
    assert not sigmoid.use_softmax and "use_softmax=False" in repr(sigmoid)
    assert sigmoid.key() != flare.AttentionVariant(SOURCE, "sig").key()
    with pytest.raises(ValueError, match="name must be a C identifier, got '2x'"):
        flare.AttentionVariant(SOURCE, "2x")
    with pytest.raises(ValueError, match="source must be non-empty"):
        flare.AttentionVariant("  ", "plain")
    with pytest.raises(ValueError, match="scalar and tensor names repeat"):
        flare.AttentionVariant(SOURCE, "plain", scalars=("a", "a"))
    with pytest.raises(ValueError, match="scalar and tensor names repeat"):
        flare.AttentionVariant(SOURCE, "plain", scalars=("a",), tensors={"a": "float32"})
    with pytest.raises(ValueError, match="must be C identifiers, got 'a b'"):
        flare.AttentionVariant(SOURCE, "plain", scalars=("a b",))
    with pytest.raises(ValueError, match="tensor t has dtype float64"):
        flare.AttentionVariant(SOURCE, "plain", tensors={"t": "float64"})
    with pytest.raises(ValueError, match="5 tensors; at most 4"):
        flare.AttentionVariant(SOURCE, "plain", tensors={f"t{i}": "uint8" for i in range(5)})
    with pytest.raises(ValueError, match="9 scalars; at most 8"):
        flare.AttentionVariant(SOURCE, "plain", scalars=[f"s{i}" for i in range(9)])
    with pytest.raises(AttributeError, match="immutable"):
        v.name = "other"
    causal_only = flare.AttentionVariant(SOURCE, "docs", requires_causal=True)
    assert causal_only.requires_causal and "requires_causal=True" in repr(causal_only)
    assert causal_only.key() != flare.AttentionVariant(SOURCE, "docs").key()


def test_library_variants_declare_what_the_engine_declares():
    doc = flare.variants.document_mask()
    assert doc.name == "document_mask" and doc.requires_causal
    assert doc.tensors == (("document_start", "int32", (-2, -1)),)  # batch, any
    assert not flare.variants.prefix_lm().requires_causal
    # A variant that needs the causal mask is refused without it before anything else
    # (checked where the variant is, ahead of the CUDA-only check of a CPU call).
    from flare.variant import check_variant
    with pytest.raises(ValueError, match="'document_mask' requires the causal mask"):
        check_variant("plan", doc, True, causal_mask=False)
    assert check_variant("plan", doc, True, causal_mask=True) is doc


def test_scalar_keywords_are_checked_by_name():
    v = flare.AttentionVariant(SOURCE, "two", scalars=("a", "b"))
    assert v.arguments("run", {"b": 2, "a": 1.5}) == ((1.5, 2.0), ())
    with pytest.raises(TypeError, match=r"needs variant 'two'.s argument\(s\) \['b'\]"):
        v.arguments("run", {"a": 1})
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['c'\]"):
        v.arguments("run", {"a": 1, "b": 2, "c": 3})
    t = flare.AttentionVariant(SOURCE, "tables", scalars=("a",),
                               tensors={"slopes": "float32", "ids": np.int32})
    assert t.tensors == (("slopes", "float32", ()), ("ids", "int32", ()))
    shaped = flare.AttentionVariant(SOURCE, "shaped", tensors={"table": ("float32", (16, None))})
    assert shaped.tensors == (("table", "float32", (16, -1)),)
    with pytest.raises(ValueError, match="extents are >= 0, None for any"):
        flare.AttentionVariant(SOURCE, "bad", tensors={"table": ("float32", (-2,))})
    symbolic = flare.AttentionVariant(
        SOURCE, "symbolic", tensors={"t": ("float32", ("num_qo_heads", "batch", "num_kv_heads"))})
    assert symbolic.tensors == (("t", "float32", (-3, -2, -4)),)
    with pytest.raises(ValueError, match="declares extent 'heads'"):
        flare.AttentionVariant(SOURCE, "bad", tensors={"t": ("float32", ("heads",))})
    slopes, ids = object(), object()
    assert t.arguments("run", {"ids": ids, "a": 1, "slopes": slopes}) == ((1.0,), (slopes, ids))
    with pytest.raises(TypeError, match=r"argument\(s\) \['ids'\]"):
        t.arguments("run", {"a": 1, "slopes": slopes})


def _cpu_paged():
    indptr = np.array([0, 1], dtype=np.int32)
    indices = np.array([0], dtype=np.int32)
    last = np.array([3], dtype=np.int32)
    return indptr, indices, last


def test_the_cpu_backend_refuses_variants():
    workspace = np.zeros(1 << 20, dtype=np.uint8)
    variant = flare.AttentionVariant(SOURCE, "plain")
    decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace)
    indptr, indices, last = _cpu_paged()
    with pytest.raises(ValueError, match="variant 'plain' runs on CUDA tensors only"):
        decode.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type="float32", variant=variant)
    prefill = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    qo = np.array([0, 2], dtype=np.int32)
    with pytest.raises(ValueError, match="runs on CUDA tensors only"):
        prefill.plan(qo, qo, 4, 2, 64, q_data_type="float32", variant=variant)
    with pytest.raises(TypeError, match="variant must be a flare.AttentionVariant"):
        decode.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type="float32",
                    variant="soft_cap")


def test_unknown_run_keywords_are_errors_without_a_variant():
    workspace = np.zeros(1 << 20, dtype=np.uint8)
    decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace)
    indptr, indices, last = _cpu_paged()
    decode.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type="float32")
    q = np.zeros((1, 4, 64), dtype=np.float32)
    cache = np.zeros((1, 2, 16, 2, 64), dtype=np.float32)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['cap'\]"):
        decode.run(q, cache, cap=30.0)
    prefill = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    qo = np.array([0, 2], dtype=np.int32)
    prefill.plan(qo, qo, 4, 2, 64, q_data_type="float32")
    k = np.zeros((2, 2, 64), dtype=np.float32)
    with pytest.raises(TypeError, match="no variant was planned"):
        prefill.run(np.zeros((2, 4, 64), dtype=np.float32), k, k, temperature=2.0)


def test_the_library_variants_declare_their_tensors_symbolically():
    assert flare.variants.prefix_lm().tensors == (("prefix_len", "int32", (-2,)),)
    rpb = flare.variants.relative_position_bias()
    assert rpb.tensors == (("table", "float32", (-3, 32)),) and rpb.scalars == ("max_distance",)
    distance = flare.variants.distance_bias()
    assert distance.tensors == (("bias", "float32", (-3, -5)),) and distance.requires_causal
    table = flare.AttentionVariant(SOURCE, "t", tensors={"bias": ("float32", ("table",))})
    assert table.tensors == (("bias", "float32", (-5,)),)
    sigmoid = flare.variants.sigmoid()
    assert not sigmoid.use_softmax and sigmoid.scalars == ("bias",)
    assert flare.variants.sigmoid() is sigmoid  # one object: the wrappers' plan cache keys hit


def test_t5_distance_bias_is_the_bucket_table_by_distance():
    """flare.variants.t5_distance_bias: row h of [H, ceil(max_distance) + 1] holds table[h] at
    T5's bucket of each distance (transformers' float32 buckets agree with the library's)."""
    torch = pytest.importorskip("torch")
    import math
    table = torch.randn(3, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for max_distance in (128.0, 40.0, 100.5):
        bias = flare.variants.t5_distance_bias(table, max_distance)
        width = math.ceil(max_distance) + 1
        assert bias.shape == (3, width) and bias.dtype == torch.float32 and bias.is_contiguous()
        n = torch.arange(width)
        large = 16 + (torch.log(n.float().clamp(min=1) / 16) / math.log(max_distance / 16)
                      * 16).long()
        buckets = torch.where(n < 16, n, large.clamp(max=31))
        assert torch.equal(bias, table.float()[:, buckets])
        assert int(buckets[-1]) == 31
    with pytest.raises(ValueError, match=r"table must be a \[num_heads, 32\] torch tensor"):
        flare.variants.t5_distance_bias(table[:, :16], 128.0)
    with pytest.raises(ValueError, match="max_distance must be finite, above 16"):
        flare.variants.t5_distance_bias(table, 16.0)
