"""Issue 17's user path on PyTorch CUDA tensors: batch invariance with fixed_split_size (a
request's output and lse bitwise identical alone or in shuffled batches, decode on both loops
and prefill), plans that need more partial slots than the default bound, scales and the LSE's
base inside the kernels, programmatic dependent launch, and bad index data (each class in its
own process: canary bytes intact, the error names the argument, the context runs a correct call
afterwards). Skipped visibly without PyTorch or without a CUDA device."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from gpu_paged_cache import GpuPagedCache  # noqa: E402

DEVICE = torch.device("cuda:0")
HERE = os.path.dirname(os.path.abspath(__file__))


def workspace():
    return torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)


def sub_cache(cache, rows):
    """indptr, indices, last_page_len (host, host/device, host) of `rows` of cache's requests,
    in that order, over the same pages."""
    indptr, indices, last = [0], [], []
    for r in rows:
        begin, end = int(cache.indptr[r]), int(cache.indptr[r + 1])
        indices.append(cache.indices[begin:end])
        indptr.append(indptr[-1] + end - begin)
        last.append(int(cache.last_page_len[r]))
    return (torch.tensor(indptr, dtype=torch.int32), torch.cat(indices).to(DEVICE),
            torch.tensor(last, dtype=torch.int32))


# 40 requests up to ~6000 tokens (the batch shape scaled to fit a quick test), 32 query
# and 8 KV heads, D 128, bf16, page 16; fixed_split_size 1024 needs more partial slots than the
# default bound (2 per CTA), so the workspace grows into the 256 MB buffer.
@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_decode_is_batch_invariant_with_fixed_split_size(use_tensor_cores):
    rng = np.random.default_rng(0)
    lens = [int(x) for x in rng.integers(1, 6000, size=40)]
    lens[3] = 5999
    cache = GpuPagedCache(lens, 8, 128, 16, "NHD", torch.bfloat16, seed=1)
    q = torch.randn(40, 32, 128, generator=torch.Generator().manual_seed(2)).to(
        torch.bfloat16).to(DEVICE)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                       use_tensor_cores=use_tensor_cores)

    def run(rows):
        indptr, indices, last = sub_cache(cache, rows)
        wrapper.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.bfloat16,
                     fixed_split_size=1024)
        return wrapper.run(q[rows], cache.cache, return_lse=True)

    full_o, full_lse = run(list(range(40)))
    shuffled = list(rng.permutation(40))
    shuffled_o, shuffled_lse = run(shuffled)
    for r in (3, 0, 17, 39):
        alone_o, alone_lse = run([r])
        assert torch.equal(alone_o[0], full_o[r]), f"request {r}: o differs alone vs batch"
        assert torch.equal(alone_lse[0], full_lse[r]), f"request {r}: lse differs"
        position = shuffled.index(r)
        assert torch.equal(shuffled_o[position], full_o[r]), f"request {r}: shuffled batch"
        assert torch.equal(shuffled_lse[position], full_lse[r])
    wrapper.check()


def test_prefill_is_batch_invariant_with_fixed_split_size():
    qo_lens = [300, 1, 57, 1024, 7]
    kv_lens = [2000, 700, 57, 1500, 3000]
    generator = torch.Generator().manual_seed(3)
    qs = [torch.randn(n, 16, 128, generator=generator).to(torch.bfloat16) for n in qo_lens]
    ks = [torch.randn(n, 4, 128, generator=generator).to(torch.bfloat16) for n in kv_lens]
    vs = [torch.randn(n, 4, 128, generator=generator).to(torch.bfloat16) for n in kv_lens]
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())

    def run(rows):
        qo = torch.tensor([0] + list(np.cumsum([qo_lens[r] for r in rows])), dtype=torch.int32)
        kv = torch.tensor([0] + list(np.cumsum([kv_lens[r] for r in rows])), dtype=torch.int32)
        wrapper.plan(qo, kv, 16, 4, 128, causal=True, q_data_type=torch.bfloat16,
                     fixed_split_size=256)
        q = torch.cat([qs[r] for r in rows]).to(DEVICE)
        k = torch.cat([ks[r] for r in rows]).to(DEVICE)
        v = torch.cat([vs[r] for r in rows]).to(DEVICE)
        out, lse = wrapper.run(q, k, v, return_lse=True)
        return torch.split(out, [qo_lens[r] for r in rows]), torch.split(
            lse, [qo_lens[r] for r in rows])

    full_o, full_lse = run([0, 1, 2, 3, 4])
    mixed_o, mixed_lse = run([4, 2, 0, 3, 1])
    order = [4, 2, 0, 3, 1]
    for r in range(5):
        alone_o, alone_lse = run([r])
        assert torch.equal(alone_o[0], full_o[r]), f"request {r}: o differs alone vs batch"
        assert torch.equal(alone_lse[0], full_lse[r])
        assert torch.equal(mixed_o[order.index(r)], full_o[r]), f"request {r}: reordered batch"
        assert torch.equal(mixed_lse[order.index(r)], full_lse[r])


def test_scales_lse_base_and_pdl_in_the_kernels():
    cache = GpuPagedCache([70, 1, 300], 2, 64, 16, "NHD", torch.float16, seed=4)
    q = torch.randn(3, 8, 64, device=DEVICE).to(torch.float16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
    wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2, 64, 16,
                 q_data_type=torch.float16)
    o, lse2 = wrapper.run(q, cache.cache, return_lse=True)
    _, lse_e = wrapper.run(q, cache.cache, return_lse=True, lse_base="ln")
    assert torch.allclose(lse2, lse_e / np.log(2.0), rtol=1e-6, atol=1e-6)
    scaled, scaled_lse = wrapper.run(q, cache.cache, q_scale=0.5, k_scale=2.0, v_scale=3.0,
                                     return_lse=True)
    assert torch.allclose(scaled.float(), 3 * o.float(), rtol=2e-3, atol=2e-3)
    assert torch.allclose(scaled_lse, lse2, atol=1e-5)
    with_pdl = wrapper.run(q, cache.cache, enable_pdl=True)
    without = wrapper.run(q, cache.cache, enable_pdl=False)
    assert torch.equal(with_pdl, without) and torch.equal(with_pdl, o)


def run_isolated(body):
    """Runs `body` (Python source) in a fresh process with the same flare; returns its stdout.
    A bad index that killed the CUDA context there cannot affect the other tests."""
    script = textwrap.dedent('''
        import sys
        sys.path.insert(0, {here!r})
        import torch, flare
        from gpu_paged_cache import GpuPagedCache
        DEVICE = torch.device("cuda:0")
        GUARD = 1 << 16

        def guarded(shape, dtype, fill):
            """A tensor carved from the middle of a larger buffer whose rest holds 0x5a."""
            numel = 1
            for n in shape:
                numel *= n
            item = torch.empty((), dtype=dtype).element_size()
            raw = torch.full((numel * item + 2 * GUARD,), 0x5a, dtype=torch.uint8, device=DEVICE)
            view = raw[GUARD:GUARD + numel * item].view(dtype).view(shape)
            view.copy_(fill)
            return raw, view

        def intact(raw):
            return bool((raw[:GUARD] == 0x5a).all() and (raw[-GUARD:] == 0x5a).all())
    ''').format(here=HERE) + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=600, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_decode_with_page_ids_outside_the_cache():
    out = run_isolated('''
        cache = GpuPagedCache([40, 300, 17], 2, 64, 16, "NHD", torch.bfloat16, seed=5)
        raw_cache, pages = guarded(tuple(cache.cache.shape), torch.bfloat16, cache.cache)
        bad = cache.indices.clone()
        bad[int(cache.indptr[1]) + 4] = pages.shape[0] + 3
        raw_idx, indices = guarded((bad.shape[0],), torch.int32, bad.to(DEVICE))
        q = torch.randn(3, 8, 64, device=DEVICE).to(torch.bfloat16)
        raw_out, out = guarded((3, 8, 64), torch.bfloat16, torch.full((3, 8, 64), float("nan")))
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)
        w = flare.BatchDecodeWithPagedKVCacheWrapper(ws, use_tensor_cores=True)
        w.plan(cache.indptr, indices, cache.last_page_len, 8, 2, 64, 16,
               q_data_type=torch.bfloat16)
        w.run(q, pages, out=out)
        torch.cuda.synchronize()
        assert intact(raw_cache) and intact(raw_idx) and intact(raw_out)
        try:
            w.check()
            raise SystemExit("check() did not raise")
        except IndexError as e:
            print("ERROR:", e)
        w.check()  # cleared
        good = cache.indices.to(DEVICE)
        w.plan(cache.indptr, good, cache.last_page_len, 8, 2, 64, 16, q_data_type=torch.bfloat16)
        expected = flare.BatchDecodeWithPagedKVCacheWrapper(ws)
        expected.plan(cache.indptr, good, cache.last_page_len, 8, 2, 64, 16,
                      q_data_type=torch.bfloat16)
        assert torch.allclose(w.run(q, cache.cache).float(), expected.run(q, cache.cache).float(),
                              atol=2e-2)
        print("OK")
    ''')
    assert "indices[" in out and "(request 1)" in out and "OK" in out, out


def test_paged_prefill_with_negative_page_ids():
    out = run_isolated('''
        cache = GpuPagedCache([100, 40], 2, 64, 16, "NHD", torch.float16, seed=6)
        raw_cache, pages = guarded(tuple(cache.cache.shape), torch.float16, cache.cache)
        bad = cache.indices.clone()
        bad[2] = -7
        q = torch.randn(20, 8, 64, device=DEVICE).to(torch.float16)
        raw_out, out = guarded((20, 8, 64), torch.float16, torch.full((20, 8, 64), float("nan")))
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)
        w = flare.BatchPrefillWithPagedKVCacheWrapper(ws)
        qo = torch.tensor([0, 12, 20], dtype=torch.int32)
        w.plan(qo, cache.indptr, bad.to(DEVICE), cache.last_page_len, 8, 2, 64, 16,
               causal=True, q_data_type=torch.float16)
        w.run(q, pages, out=out)
        torch.cuda.synchronize()
        assert intact(raw_cache) and intact(raw_out)
        try:
            w.check()
            raise SystemExit("check() did not raise")
        except IndexError as e:
            print("ERROR:", e)
        w.plan(qo, cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2, 64, 16,
               causal=True, q_data_type=torch.float16)
        assert not torch.isnan(w.run(q, cache.cache)).any()
        print("OK")
    ''')
    assert "paged_kv_indices[2] = -7 (request 0)" in out and "OK" in out, out


def test_ragged_kv_shorter_than_kv_indptr_is_rejected_before_launching():
    out = run_isolated('''
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)
        w = flare.BatchPrefillWithRaggedKVCacheWrapper(ws)
        qo = torch.tensor([0, 5, 9], dtype=torch.int32)
        kv = torch.tensor([0, 50, 90], dtype=torch.int32)
        w.plan(qo, kv, 4, 4, 64, causal=True, q_data_type=torch.float16)
        q = torch.randn(9, 4, 64, device=DEVICE).to(torch.float16)
        k = torch.randn(89, 4, 64, device=DEVICE).to(torch.float16)
        out = torch.full((9, 4, 64), float("nan"), dtype=torch.float16, device=DEVICE)
        try:
            w.run(q, k, k, out=out)
            raise SystemExit("run() did not raise")
        except ValueError as e:
            print("ERROR:", e)
        torch.cuda.synchronize()
        assert torch.isnan(out).all()  # nothing launched
        k = torch.randn(90, 4, 64, device=DEVICE).to(torch.float16)
        assert not torch.isnan(w.run(q, k, k)).any()
        print("OK")
    ''')
    assert "kv_indptr[2]=90" in out and "OK" in out, out


def test_append_with_a_position_past_its_pages():
    out = run_isolated('''
        cache = GpuPagedCache([4, 2], 1, 64, 3, "NHD", torch.float16, seed=8)
        raw, pool = guarded(tuple(cache.cache.shape), torch.float16, cache.cache.nan_to_num())
        key = torch.ones(2, 1, 64, dtype=torch.float16, device=DEVICE)
        batch = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
        positions = torch.tensor([3, 6], dtype=torch.int32, device=DEVICE)  # request 1: 1 page
        flare.append_paged_kv_cache(key, key, batch, positions, pool, cache.indices.to(DEVICE),
                                    cache.indptr.to(DEVICE), cache.last_page_len.to(DEVICE))
        torch.cuda.synchronize()
        assert intact(raw)
        try:
            flare.check_append_paged_kv_cache()
            raise SystemExit("check did not raise")
        except IndexError as e:
            print("ERROR:", e)
        flare.check_append_paged_kv_cache()  # cleared
        print("OK")
    ''')
    assert "positions[1] = 6" in out and "OK" in out, out


def test_validation_mode_raises_before_launching():
    out = run_isolated('''
        cache = GpuPagedCache([40, 30], 2, 64, 16, "NHD", torch.bfloat16, seed=9)
        bad = cache.indices.clone()
        bad[0] = 10 ** 6
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)
        w = flare.BatchDecodeWithPagedKVCacheWrapper(ws, validate=True)
        w.plan(cache.indptr, bad.to(DEVICE), cache.last_page_len, 8, 2, 64, 16,
               q_data_type=torch.bfloat16)
        q = torch.randn(2, 8, 64, device=DEVICE).to(torch.bfloat16)
        out = torch.full((2, 8, 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        try:
            w.run(q, cache.cache, out=out)
            raise SystemExit("run() did not raise")
        except IndexError as e:
            print("ERROR:", e)
        torch.cuda.synchronize()
        assert torch.isnan(out).all()
        print("OK")
    ''')
    assert "indices[0] = 1000000 (request 0)" in out and "validation mode" in out, out


@pytest.mark.parametrize("wrapper_kind", ["decode", "paged prefill"])
def test_a_graph_mode_plan_does_not_wait_for_the_device(wrapper_kind):
    """plan() of a use_cuda_graph wrapper fills its fixed buffers from host arrays without
    waiting for the device (issue 17: no device synchronization in plan()): planned behind ~0.5 s
    of queued GPU work it returns at once, and the buffers hold the new arrays once the stream
    reaches the copies."""
    batch, page = 4, 16
    indptr = torch.tensor([0, 2, 5, 6, 9], dtype=torch.int32)
    indices = torch.arange(9, dtype=torch.int32, device=DEVICE)
    last = torch.tensor([3, 16, 1, 7], dtype=torch.int32)
    buffers = dict(paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32,
                                                      device=DEVICE),
                   paged_kv_indices_buffer=torch.zeros(16, dtype=torch.int32, device=DEVICE),
                   paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32,
                                                             device=DEVICE))
    if wrapper_kind == "decode":
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD",
                                                           use_cuda_graph=True, **buffers)

        def plan(lengths_last):
            wrapper.plan(indptr, indices, lengths_last, 8, 2, 128, page,
                         q_data_type=torch.bfloat16)
    else:
        qo = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
        wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(
            workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo,
            paged_kv_indptr_buf=buffers["paged_kv_indptr_buffer"],
            paged_kv_indices_buf=buffers["paged_kv_indices_buffer"],
            paged_kv_last_page_len_buf=buffers["paged_kv_last_page_len_buffer"])

        def plan(lengths_last):
            wrapper.plan(torch.arange(batch + 1, dtype=torch.int32), indptr, indices,
                         lengths_last, 8, 2, 128, page, q_data_type=torch.bfloat16)

    plan(last)  # compiles; its copies recorded
    torch.cuda.synchronize()
    new_last = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    torch.cuda._sleep(int(1e9))  # ~0.5 s of GPU time queued before the plan's copies
    start = time.perf_counter()
    plan(new_last)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    assert elapsed < 0.2, f"plan() took {elapsed:.3f} s behind queued GPU work"
    assert torch.equal(buffers["paged_kv_last_page_len_buffer"].cpu(), new_last)
    assert torch.equal(buffers["paged_kv_indptr_buffer"].cpu(), indptr)


def test_graph_buffers_are_refilled_from_any_index_form_and_left_alone_on_bad_input():
    """plan() of a use_cuda_graph wrapper copies the caller's arrays into its fixed buffers in
    one extension call (_flare.IndexStaging): lists, int64 numpy arrays, strided host tensors,
    int64 CUDA tensors and a buffer passed as its own source all land as int32; an array longer
    than its buffer raises naming both before any buffer changes."""
    batch = 3
    qo = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
    kv_indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
    indices_buf = torch.full((12,), -5, dtype=torch.int32, device=DEVICE)
    last_buf = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo,
        paged_kv_indptr_buf=kv_indptr_buf, paged_kv_indices_buf=indices_buf,
        paged_kv_last_page_len_buf=last_buf)
    qo_host = torch.arange(0, 2 * batch + 1, 2, dtype=torch.int32)
    kv_indptr = [0, 2, 3, 6]
    pages = [7, 1, 4, 0, 2, 9]
    strided = torch.tensor([[p, -1] for p in pages], dtype=torch.int32)[:, 0]  # stride 2
    last = torch.tensor([5, 16, 2], dtype=torch.int32)
    wrapper.plan(qo_host, kv_indptr, strided, last, 4, 2, 64, 16, q_data_type=torch.float16)
    torch.cuda.synchronize()
    assert qo.cpu().tolist() == qo_host.tolist()
    assert kv_indptr_buf.cpu().tolist() == kv_indptr
    assert indices_buf.cpu().tolist() == pages + [-5] * 6
    assert last_buf.cpu().tolist() == [5, 16, 2]

    # The buffers as their own sources (FlashInfer users pass them back), numpy int64 and an
    # int64 CUDA tensor.
    pages = [3, 8, 6, 5, 1, 0]
    wrapper.plan(qo, np.array(kv_indptr, dtype=np.int64),
                 torch.tensor(pages, dtype=torch.int64, device=DEVICE), last_buf, 4, 2, 64, 16,
                 q_data_type=torch.float16)
    torch.cuda.synchronize()
    assert qo.cpu().tolist() == qo_host.tolist() and kv_indptr_buf.cpu().tolist() == kv_indptr
    assert indices_buf.cpu().tolist() == pages + [-5] * 6
    assert last_buf.cpu().tolist() == [5, 16, 2]

    before = [b.clone() for b in (qo, kv_indptr_buf, indices_buf, last_buf)]
    too_many = torch.arange(13, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="paged_kv_indices has 13 entries, more than "
                                         "paged_kv_indices_buf's 12"):
        wrapper.plan(qo_host, [0, 2, 3, 13], too_many, [5, 16, 2], 4, 2, 64, 16,
                     q_data_type=torch.float16)
    torch.cuda.synchronize()
    for buffer, old in zip((qo, kv_indptr_buf, indices_buf, last_buf), before):
        assert torch.equal(buffer, old)


def test_index_staging_fills_one_buffer_from_several_sources_at_offsets():
    """IndexStaging.fill's optional sixth entry (the cascade joins its levels' page ids so): a
    host and a device source land back to back; an offset or a count past the buffer is refused
    by name before anything is copied."""
    staging = flare._flare.IndexStaging()
    stream = flare._flare.current_stream(torch.cuda.current_device())
    buf = torch.full((10,), -1, dtype=torch.int32, device=DEVICE)
    host = np.array([4, 5, 6], dtype=np.int32)
    dev = torch.tensor([7, 8, 9, 10], dtype=torch.int32, device=DEVICE)
    staging.fill(stream, ((buf, "joined", host, "level 0", 3, 0),
                          (buf, "joined", dev, "level 1", 4, 3)), False)
    torch.cuda.synchronize()
    assert buf.cpu().tolist() == [4, 5, 6, 7, 8, 9, 10, -1, -1, -1]
    with pytest.raises(ValueError, match="level 1: offset 11 outside joined's 10 entries"):
        staging.fill(stream, ((buf, "joined", host, "level 0", 3, 0),
                              (buf, "joined", dev, "level 1", 4, 11)), False)
    with pytest.raises(ValueError, match="level 1 has 4 entries, more than joined's 3 from its "
                                         "offset"):
        staging.fill(stream, ((buf, "joined", dev, "level 1", 4, 7),), False)
    torch.cuda.synchronize()
    assert buf.cpu().tolist() == [4, 5, 6, 7, 8, 9, 10, -1, -1, -1]


@pytest.mark.parametrize("wrapper_kind", ["decode", "paged prefill"])
def test_host_page_ids_are_staged_without_waiting_and_kept_in_stream_order(wrapper_kind):
    """Outside CUDA graphs a host page table reaches the device through the wrapper's pinned
    staging (not a pageable copy, which waits for all GPU work queued on the stream): plan()
    behind ~0.5 s of queued GPU work returns at once, and a run queued before a later plan()
    that rewrites the page ids keeps its own plan's pages."""
    small = GpuPagedCache([40, 7, 100], 2, 128, 16, "NHD", torch.bfloat16, seed=5)
    large = GpuPagedCache([300, 33, 5], 2, 128, 16, "NHD", torch.bfloat16, seed=6)
    q = torch.randn(3, 8, 128, dtype=torch.bfloat16, device=DEVICE)

    def make():
        if wrapper_kind == "decode":
            return flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
        return flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")

    def plan(wrapper, c):
        head = () if wrapper_kind == "decode" else (torch.arange(4, dtype=torch.int32),)
        wrapper.plan(*head, c.indptr, c.indices, c.last_page_len, 8, 2, 128, 16,
                     q_data_type=torch.bfloat16)

    expected = {}
    for name, c in (("small", small), ("large", large)):
        reference = make()
        plan(reference, c)
        expected[name] = reference.run(q, c.cache)
    wrapper = make()
    plan(wrapper, large)  # compiles; sizes the page-id buffer for the larger table
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e9))  # ~0.5 s of GPU time queued before the plan's copy
    start = time.perf_counter()
    plan(wrapper, small)
    elapsed = time.perf_counter() - start
    out_small = wrapper.run(q, small.cache)
    plan(wrapper, large)  # rewrites the buffer the queued run reads, after it in stream order
    out_large = wrapper.run(q, large.cache)
    torch.cuda.synchronize()
    assert elapsed < 0.2, f"plan() took {elapsed:.3f} s behind queued GPU work"
    assert torch.equal(out_small, expected["small"])
    assert torch.equal(out_large, expected["large"])
