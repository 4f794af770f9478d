"""single_decode_with_kv_cache inside a CUDA graph (FlashInfer issue #541: torch.compile
(mode="reduce-overhead") captures it after a warm-up): a captured call replays with new q, k, v
values, matching eager calls bitwise; under torch.compile; the first call of a shape inside a
capture refused by name. Skipped visibly without PyTorch or a CUDA device."""

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
    """As FlashInfer's issue #541 test: in a subprocess (torch.library registration must happen
    at module level for dynamo)."""
    script = textwrap.dedent("""\
        import torch
        import flare

        torch.library.define("flare_test::single_decode", "(Tensor q, Tensor k, Tensor v) -> Tensor")

        @torch.library.impl("flare_test::single_decode", "cuda")
        def _impl(q, k, v):
            return flare.single_decode_with_kv_cache(q, k, v)

        @torch.library.register_fake("flare_test::single_decode")
        def _fake(q, k, v):
            return torch.empty_like(q)

        compiled = torch.compile(lambda q, k, v: torch.ops.flare_test.single_decode(q, k, v),
                                 mode="reduce-overhead", fullgraph=True)
        for i in range(3):
            q = torch.randn(8, 128, device="cuda", dtype=torch.float16)
            k = torch.randn(256, 2, 128, device="cuda", dtype=torch.float16)
            v = torch.randn(256, 2, 128, device="cuda", dtype=torch.float16)
            got = compiled(q, k, v).clone()
            assert torch.equal(got, flare.single_decode_with_kv_cache(q, k, v)), i
        torch.cuda.synchronize()
        print("PASS")
        """)
    env = dict(os.environ)
    env.setdefault("USER", "flare-tests")  # inductor's cache directory needs a user name
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0 and "PASS" in result.stdout, result.stderr[-2000:]
