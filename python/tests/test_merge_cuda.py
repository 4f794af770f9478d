"""merge_state, merge_state_in_place and merge_states on PyTorch CUDA tensors (flare's merge
kernels) against a float64 torch computation: float32/float16/bfloat16, head dims 64/128/256
and odd ones, odd seq and head counts, -inf states whose v is NaN, strided and transposed views,
masks, 1/3/17 states, a side stream and CUDA-graph replay. Skipped visibly without PyTorch or
without a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402

DEVICE = torch.device("cuda:0")
SEQ, HEADS = 97, 7
# Relative rounding of the output dtype; float32 math adds (states + 5) * 2^-22 of the largest
# |v| merged (twice over, as the bound below allows) and the LSE as much plus 2^-22 |lse|.
OUTPUT_ROUNDING = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def merge_float64(v, s, base2=True):
    """Merges v [seq, n, H, D] (any dtype), s [seq, n, H] (base-2 LSEs, FlashInfer's, or
    natural-log ones) along dim 1 in float64. Returns (v [seq, H, D], s [seq, H], the bound on
    |error| of each output element and LSE)."""
    v = v.double()
    s = s.double()
    exp, log = (torch.exp2, torch.log2) if base2 else (torch.exp, torch.log)
    empty = torch.isneginf(s)
    s_max = torch.where(empty, torch.full_like(s, -torch.inf), s).amax(dim=1, keepdim=True)
    shift = torch.where(torch.isneginf(s_max), torch.zeros_like(s_max), s_max)
    weights = torch.where(empty, torch.zeros_like(s), exp(s - shift))
    total = weights.sum(dim=1, keepdim=True)
    scale = torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), 0.0)
    v_used = torch.where(empty[..., None], torch.zeros_like(v), v)  # NaN v of empty states
    merged_v = (v_used * scale[..., None]).sum(dim=1)
    merged_s = torch.where(total > 0, shift + log(torch.where(total > 0, total, 1.0)),
                           -torch.inf)[:, 0]
    states = v.shape[1]
    accumulation = (states + 5) * 2.0**-22
    largest = v_used.abs().amax(dim=1) if states else torch.zeros_like(merged_v)
    single = ((~empty).sum(dim=1) <= 1)  # at most one non-empty state: exact
    return merged_v, merged_s, accumulation, largest, single


def assert_merged(v_out, s_out, v, s, out_dtype, base2=True):
    """v_out, s_out against the float64 merge of v [seq, n, H, D], s [seq, n, H]."""
    expected_v, expected_s, accumulation, largest, single = merge_float64(v, s, base2)
    v_bound = (OUTPUT_ROUNDING[out_dtype] * expected_v.abs() + 2 * accumulation * largest +
               1e-7)
    v_bound = torch.where(single[..., None], torch.zeros_like(v_bound), v_bound)
    s_bound = torch.where(single, torch.zeros_like(expected_s),
                          2.0**-22 * expected_s.abs().nan_to_num(posinf=0.0, neginf=0.0) +
                          accumulation)
    actual_v = v_out.double().cpu()
    actual_s = s_out.double().cpu()
    expected_v, expected_s = expected_v.cpu(), expected_s.cpu()
    v_ok = (actual_v == expected_v) | ((actual_v - expected_v).abs() <= v_bound.cpu())
    s_ok = (actual_s == expected_s) | ((actual_s - expected_s).abs() <= s_bound.cpu())
    assert bool(v_ok.all()), (
        f"{int((~v_ok).sum())} v elements off; first at {(~v_ok).nonzero()[0].tolist()}")
    assert bool(s_ok.all()), (
        f"{int((~s_ok).sum())} s elements off; first at {(~s_ok).nonzero()[0].tolist()}")


def random_states(seq, num_states, heads, dim, dtype, seed):
    """v [seq, n, H, D] of dtype and s float32 [seq, n, H] on the GPU: some empty states (their
    v NaN), whole empty rows, equal LSEs, far-apart and large LSEs."""
    generator = torch.Generator().manual_seed(seed)
    v = torch.randn(seq, num_states, heads, dim, generator=generator)
    s = torch.rand(seq, num_states, heads, generator=generator) * 40 - 20
    rows = torch.arange(seq * heads).reshape(seq, heads)
    if num_states == 2:
        s[:, 0][rows % 13 == 1] = -torch.inf
        s[:, 1][rows % 13 == 2] = -torch.inf
        s[(rows % 13 == 3)[:, None, :].expand(-1, 2, -1)] = -torch.inf
        s[(rows % 13 == 4)[:, None, :].expand(-1, 2, -1)] = 3.25
        far = (rows % 13 == 5)
        s[:, 0][far] += 700
        s[:, 1][far] -= 650
    else:
        state = torch.arange(num_states)[None, :, None]
        empty = ((rows[:, None, :] + state) % 4 == 0) | (rows % 7 == 3)[:, None, :]
        s[empty] = -torch.inf
        s[(rows % 11 == 5)[:, None, :].expand(-1, num_states, -1)] += 500
    v[torch.isneginf(s)] = torch.nan
    return v.to(dtype).to(DEVICE), s.to(DEVICE)


def strided(t, layout):
    """t as a view with the requested layout: "contiguous", "padded" (a slice of a larger
    tensor, rows still 16-byte aligned), "misaligned" (one element off) or "transposed" (the
    last dim not unit-stride). Values are equal to t's."""
    if layout == "contiguous":
        return t.clone()
    if layout == "padded":
        big = torch.full((t.shape[0] + 2, *t.shape[1:-1], t.shape[-1] + 16), torch.nan,
                         dtype=t.dtype, device=t.device)
        view = big[1:-1, ..., 8:-8]
    elif layout == "misaligned":
        big = torch.full((*t.shape[:-1], t.shape[-1] + 1), torch.nan, dtype=t.dtype,
                         device=t.device)
        view = big[..., 1:]
    else:
        view = torch.empty(t.transpose(-1, -2).shape, dtype=t.dtype, device=t.device)
        view = view.transpose(-1, -2)
    view.copy_(t)
    return view


@pytest.mark.parametrize("layout", ["contiguous", "padded", "misaligned", "transposed"])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_state_matches_float64(dtype, dim, layout):
    v, s = random_states(SEQ, 2, HEADS, dim, dtype, seed=dim)
    v_a, v_b = strided(v[:, 0], layout), strided(v[:, 1], layout)
    s_a, s_b = s[:, 0], s[:, 1]  # strided: every second float of s
    merged_v, merged_s = flare.merge_state(v_a, s_a, v_b, s_b)
    assert merged_v.dtype == dtype and merged_v.shape == (SEQ, HEADS, dim)
    assert merged_s.dtype == torch.float32 and merged_s.shape == (SEQ, HEADS)
    assert_merged(merged_v, merged_s, v, s, dtype)
    # Deterministic and commutative, bit for bit.
    again_v, again_s = flare.merge_state(v_b, s_b, v_a, s_a)
    assert torch.equal(again_v, merged_v) and torch.equal(again_s, merged_s)


@pytest.mark.parametrize("dim", [1, 7, 96, 0])
def test_merge_state_odd_head_dims(dim):
    v, s = random_states(5, 2, 3, dim, torch.float16, seed=3)
    merged_v, merged_s = flare.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    assert_merged(merged_v, merged_s, v, s, torch.float16)


@pytest.mark.parametrize("mask_kind", [None, "cuda_bool", "cpu_bool", "cuda_uint8"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_state_in_place_merges_masked_rows_only(dtype, mask_kind):
    v, s = random_states(SEQ, 2, HEADS, 128, dtype, seed=5)
    target_v, target_s = strided(v[:, 0], "padded"), s[:, 0].clone()
    original_v, original_s = target_v.clone(), target_s.clone()
    keep = torch.rand(SEQ, generator=torch.Generator().manual_seed(6)) < 0.6
    mask = {None: None, "cuda_bool": keep.to(DEVICE), "cpu_bool": keep,
            "cuda_uint8": keep.to(DEVICE, torch.uint8) * 3}[mask_kind]
    flare.merge_state_in_place(target_v, target_s, v[:, 1], s[:, 1], mask=mask)
    rows = torch.ones(SEQ, dtype=torch.bool) if mask is None else keep
    assert_merged(target_v[rows.to(DEVICE)], target_s[rows.to(DEVICE)], v[rows.to(DEVICE)],
                  s[rows.to(DEVICE)], dtype)
    untouched = (~rows).to(DEVICE)
    # NaN rows (empty states) stay NaN: compare bits.
    assert torch.equal(target_v[untouched].view(torch.uint8),
                       original_v[untouched].view(torch.uint8))
    assert torch.equal(target_s[untouched].view(torch.uint8),
                       original_s[untouched].view(torch.uint8))


@pytest.mark.parametrize("layout", ["contiguous", "padded", "transposed"])
@pytest.mark.parametrize("num_states", [1, 3, 17])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_states_matches_float64(dtype, dim, num_states, layout):
    v, s = random_states(SEQ, num_states, HEADS, dim, dtype, seed=num_states * dim)
    merged_v, merged_s = flare.merge_states(strided(v, layout), s)
    assert merged_v.shape == (SEQ, HEADS, dim) and merged_v.dtype == dtype
    assert_merged(merged_v, merged_s, v, s, dtype)


def test_merge_states_of_a_strided_slice_of_states():
    v, s = random_states(SEQ, 9, HEADS, 128, torch.bfloat16, seed=8)
    merged_v, merged_s = flare.merge_states(v[:, 1::2], s[:, 1::2])
    assert_merged(merged_v, merged_s, v[:, 1::2], s[:, 1::2], torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_variable_length_merge_states_matches_float64(dtype):
    """flashinfer.triton.cascade's variable_length_merge_states: row r merges the states
    indptr[r] .. indptr[r + 1] - 1 (empty rows, single states, a long range), indptr on the
    device (FlashInfer's test) or on the host."""
    import flare.triton

    lengths = [3, 0, 1, 300, 17, 0, 2]
    indptr = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    total = int(indptr[-1])
    v, s = random_states(1, total, HEADS, 128, dtype, seed=31)
    v, s = v[0], s[0]
    for given in (indptr.to(DEVICE), indptr):
        merged_v, merged_s = flare.triton.cascade.variable_length_merge_states(v, s, given)
        assert merged_v.shape == (len(lengths), HEADS, 128) and merged_v.dtype == dtype
        for row, length in enumerate(lengths):
            begin = int(indptr[row])
            if length == 0:
                assert torch.all(merged_v[row] == 0) and torch.all(merged_s[row] == -torch.inf)
                continue
            assert_merged(merged_v[row:row + 1], merged_s[row:row + 1],
                          v[None, begin:begin + length], s[None, begin:begin + length], dtype)


def test_merge_runs_on_the_callers_stream():
    v, s = random_states(SEQ, 3, HEADS, 128, torch.float16, seed=9)
    flare.merge_states(v, s)  # compiles and loads the kernel first
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        late_v = torch.full_like(v, torch.nan)
        # The side stream writes the input only after a long sleep: a merge launched on any
        # other stream would read the NaN.
        torch.cuda._sleep(50_000_000)
        late_v.copy_(v)
        merged_v, merged_s = flare.merge_states(late_v, s)
    side.synchronize()
    assert_merged(merged_v, merged_s, v, s, torch.float16)


def test_merge_in_a_cuda_graph_replays_on_new_inputs():
    v, s = random_states(SEQ, 2, HEADS, 128, torch.bfloat16, seed=10)
    target_v, target_s = v[:, 0].clone(), s[:, 0].clone()
    other_v, other_s = v[:, 1].clone(), s[:, 1].clone()
    stacked_v, stacked_s = v.clone(), s.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles and loads the kernels
        flare.merge_state_in_place(target_v.clone(), target_s.clone(), other_v, other_s)
        flare.merge_states(stacked_v, stacked_s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flare.merge_state_in_place(target_v, target_s, other_v, other_s)
        merged_v, merged_s = flare.merge_states(stacked_v, stacked_s)
    for seed in (11, 12):
        new_v, new_s = random_states(SEQ, 2, HEADS, 128, torch.bfloat16, seed=seed)
        target_v.copy_(new_v[:, 0])
        target_s.copy_(new_s[:, 0])
        other_v.copy_(new_v[:, 1])
        other_s.copy_(new_s[:, 1])
        stacked_v.copy_(new_v)
        stacked_s.copy_(new_s)
        graph.replay()
        torch.cuda.synchronize()
        assert_merged(target_v, target_s, new_v, new_s, torch.bfloat16)
        assert_merged(merged_v, merged_s, new_v, new_s, torch.bfloat16)


def test_mismatched_devices_and_dtypes_raise():
    v, s = random_states(5, 2, 3, 64, torch.float16, seed=13)
    with pytest.raises(ValueError, match="s_b must be on cuda:0"):
        flare.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1].cpu())
    with pytest.raises(ValueError, match="v_b dtype must be v_a's float16"):
        flare.merge_state(v[:, 0], s[:, 0], v[:, 1].bfloat16(), s[:, 1])
    with pytest.raises(ValueError, match="s must be float32"):
        flare.merge_states(v, s.half())
    with pytest.raises(ValueError, match="v dtype must be float32, float16 or bfloat16"):
        flare.merge_states(v.to(torch.float8_e4m3fn), s)
    # merge_state_in_place on CUDA tensors (one extension call reading them in place): the
    # same checks, nothing written on a bad call.
    target_v, target_s = v[:, 0].clone(), s[:, 0].clone()
    with pytest.raises(ValueError, match="s_other must be on cuda:0"):
        flare.merge_state_in_place(target_v, target_s, v[:, 1], s[:, 1].cpu())
    with pytest.raises(ValueError, match="s dtype must be float32"):
        flare.merge_state_in_place(target_v, target_s.half(), v[:, 1], s[:, 1])
    with pytest.raises(ValueError, match="v_other must have the shape of v"):
        flare.merge_state_in_place(target_v, target_s, v[:4, 1], s[:4, 1])
    torch.cuda.synchronize()
    # NaN rows (empty states) stay NaN: compare bits.
    assert torch.equal(target_v.view(torch.uint8), v[:, 0].contiguous().view(torch.uint8))
    assert torch.equal(target_s.view(torch.uint8), s[:, 0].contiguous().view(torch.uint8))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_merge_on_the_second_device():
    v, s = random_states(SEQ, 3, HEADS, 128, torch.float16, seed=14)
    v1, s1 = v.to("cuda:1"), s.to("cuda:1")
    with torch.cuda.device(0):  # the current device is not the tensors'
        merged_v, merged_s = flare.merge_states(v1, s1)
    assert merged_v.device == v1.device
    torch.cuda.synchronize(1)
    assert_merged(merged_v, merged_s, v, s, torch.float16)
