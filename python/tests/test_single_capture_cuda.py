"""single_decode_with_kv_cache and single_prefill_with_kv_cache inside a CUDA graph (FlashInfer
issue #541: torch.compile(mode="reduce-overhead") captures them after a warm-up): a captured call
replays with new q, k, v values (and a new custom mask), matching eager calls bitwise; under
torch.compile; the first call of a shape inside a capture refused by name. Skipped visibly
without PyTorch or a CUDA device."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402

DEVICE = torch.device("cuda:0")


def inputs(kv_len, seed):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(8, 128, device=DEVICE, generator=generator).half()
    k = torch.randn(kv_len, 2, 128, device=DEVICE, generator=generator).half()
    v = torch.randn(kv_len, 2, 128, device=DEVICE, generator=generator).half()
    return q, k, v


def check_under_torch_compile(name, call, q_shape, kv_shape, calls):
    """As FlashInfer's issue #541 tests: `call` (an expression of q, k, v) registered as the torch
    op flare_test::<name>, compiled with mode="reduce-overhead" and called `calls` times on new
    fp16 inputs, each output equal to an eager call's. In a subprocess: torch.library
    registration must happen at module level for dynamo."""
    script = textwrap.dedent(f"""\
        import torch
        import flare

        torch.library.define("flare_test::{name}", "(Tensor q, Tensor k, Tensor v) -> Tensor")

        @torch.library.impl("flare_test::{name}", "cuda")
        def _impl(q, k, v):
            return {call}

        @torch.library.register_fake("flare_test::{name}")
        def _fake(q, k, v):
            return torch.empty_like(q)

        compiled = torch.compile(lambda q, k, v: torch.ops.flare_test.{name}(q, k, v),
                                 mode="reduce-overhead", fullgraph=True)
        for i in range({calls}):
            q = torch.randn({q_shape}, device="cuda", dtype=torch.float16)
            k = torch.randn({kv_shape}, device="cuda", dtype=torch.float16)
            v = torch.randn({kv_shape}, device="cuda", dtype=torch.float16)
            got = compiled(q, k, v).clone()
            assert torch.equal(got, {call}), i
        torch.cuda.synchronize()
        print("PASS")
        """)
    env = dict(os.environ)
    env.setdefault("USER", "flare-tests")  # inductor's cache directory needs a user name
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0 and "PASS" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("kv_len", [1, 300, 5000])
def test_a_captured_single_decode_replays_with_new_values(kv_len):
    q, k, v = inputs(kv_len, 1)
    flare.single_decode_with_kv_cache(q, k, v)  # warm-up: plans this shape
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = flare.single_decode_with_kv_cache(q, k, v)
    for seed in (2, 3):
        q2, k2, v2 = inputs(kv_len, seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, flare.single_decode_with_kv_cache(q2, k2, v2))


def test_first_call_of_a_shape_inside_a_capture_is_refused_by_name(monkeypatch):
    q, k, v = inputs(777, 4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="kv_len=777"):
        flare.single_decode_with_kv_cache(q, k, v)


def test_single_decode_under_torch_compile_reduce_overhead():
    check_under_torch_compile("single_decode", "flare.single_decode_with_kv_cache(q, k, v)",
                              "8, 128", "256, 2, 128", 3)


def prefill_inputs(qo_len, kv_len, seed):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(qo_len, 8, 128, device=DEVICE, generator=generator).half()
    k = torch.randn(kv_len, 2, 128, device=DEVICE, generator=generator).half()
    v = torch.randn(kv_len, 2, 128, device=DEVICE, generator=generator).half()
    mask = torch.rand(qo_len, kv_len, device=DEVICE, generator=generator) < 0.7
    return q, k, v, mask


def capture(call):
    """(graph, its output) of call() captured on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = call()
    return graph, out


@pytest.mark.parametrize("qo_len,kv_len,causal", [(1, 1, False), (128, 128, True),
                                                  (37, 1000, True), (300, 5000, False)])
def test_a_captured_single_prefill_replays_with_new_values(qo_len, kv_len, causal):
    q, k, v, _ = prefill_inputs(qo_len, kv_len, 1)
    flare.single_prefill_with_kv_cache(q, k, v, causal=causal)  # warm-up: plans this shape
    graph, (out, lse) = capture(lambda: flare.single_prefill_with_kv_cache(
        q, k, v, causal=causal, return_lse=True))
    for seed in (2, 3):
        q2, k2, v2, _ = prefill_inputs(qo_len, kv_len, seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = flare.single_prefill_with_kv_cache(q2, k2, v2, causal=causal,
                                                            return_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_a_captured_single_prefill_reads_each_replays_custom_mask():
    q, k, v, mask = prefill_inputs(45, 301, 5)
    flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)  # warm-up
    graph, out = capture(lambda: flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask))
    for seed in (6, 7):
        _, _, _, mask2 = prefill_inputs(45, 301, seed)
        mask.copy_(mask2)
        graph.replay()
        torch.cuda.synchronize()
        want = flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask2)
        assert torch.equal(out, want)
        # the masked-out keys matter: a different mask gives a different answer
        assert not torch.equal(out, flare.single_prefill_with_kv_cache(q, k, v))


def test_first_single_prefill_of_a_shape_inside_a_capture_is_refused_by_name(monkeypatch):
    q, k, v, _ = prefill_inputs(13, 777, 4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="qo_len=13, kv_len=777"):
        flare.single_prefill_with_kv_cache(q, k, v)


def test_a_host_custom_mask_inside_a_capture_is_refused_by_name(monkeypatch):
    q, k, v, mask = prefill_inputs(9, 40, 8)
    flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="custom_mask is on the host"):
        flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask.cpu())


def test_a_wrong_sized_custom_mask_is_refused_by_name():
    q, k, v, mask = prefill_inputs(9, 40, 9)
    flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    with pytest.raises(ValueError, match="custom_mask must have qo_len x kv_len = 360"):
        flare.single_prefill_with_kv_cache(q, k, v, custom_mask=mask[:, :39])


def test_single_prefill_under_torch_compile_reduce_overhead():
    """FlashInfer's issue #541 prefill test, with each output checked against an eager call."""
    check_under_torch_compile(
        "single_prefill", "flare.single_prefill_with_kv_cache(q, k, v, causal=True)",
        "128, 8, 128", "128, 8, 128", 4)


def test_repeated_single_decodes_take_each_calls_options():
    """A call repeating an earlier one's shapes and options runs its plan directly (flare/
    _shape_cache.py for_call): the same answer bitwise, and the options that may change per call
    (scales, return_lse, lse_base) still apply; a different layout or shape is checked anew."""
    q, k, v = inputs(300, 7)
    o_1, lse_1 = flare.single_decode_with_kv_cache(q, k, v, return_lse=True)
    o_2, lse_2 = flare.single_decode_with_kv_cache(q, k, v, return_lse=True)
    assert torch.equal(o_1, o_2) and torch.equal(lse_1, lse_2)
    assert torch.equal(flare.single_decode_with_kv_cache(q, k, v), o_1)
    _, lse_ln = flare.single_decode_with_kv_cache(q, k, v, return_lse=True, lse_base="ln")
    torch.testing.assert_close(lse_ln, lse_1 * 0.6931471805599453, atol=1e-5, rtol=1e-6)
    scaled = flare.single_decode_with_kv_cache(q, k, v, k_scale=0.5, v_scale=2.0)
    want = flare.single_decode_with_kv_cache(q, k, v, sm_scale=0.5 / 128 ** 0.5) * 2.0
    torch.testing.assert_close(scaled.float(), want.float(), atol=2e-3, rtol=2e-3)
    hnd = flare.single_decode_with_kv_cache(q, k.transpose(0, 1).contiguous(),
                                            v.transpose(0, 1).contiguous(), kv_layout="HND")
    torch.testing.assert_close(hnd, o_1, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match=r"v must have k's tokens and heads \(k \(300, 2, 128\)"):
        flare.single_decode_with_kv_cache(q, k, v[:-1])


def test_repeated_single_prefills_take_each_calls_options():
    q, k, v, _ = prefill_inputs(37, 300, 11)
    o_1, lse_1 = flare.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    o_2, lse_2 = flare.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o_1, o_2) and torch.equal(lse_1, lse_2)
    assert not torch.equal(flare.single_prefill_with_kv_cache(q, k, v), o_1)  # not causal
    assert torch.equal(flare.single_prefill_with_kv_cache(q, k, v, causal=True), o_1)
    _, lse_ln = flare.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True,
                                                   lse_base="ln")
    torch.testing.assert_close(lse_ln, lse_1 * 0.6931471805599453, atol=1e-5, rtol=1e-6)
    scaled = flare.single_prefill_with_kv_cache(q, k, v, causal=True, k_scale=0.5, v_scale=2.0)
    want = flare.single_prefill_with_kv_cache(q, k, v, causal=True,
                                              sm_scale=0.5 / q.shape[-1] ** 0.5) * 2.0
    torch.testing.assert_close(scaled.float(), want.float(), atol=2e-3, rtol=2e-3)
    with pytest.raises((ValueError, RuntimeError)):  # checked, not run on the memo
        flare.single_prefill_with_kv_cache(q, k, v[:-1], causal=True)
