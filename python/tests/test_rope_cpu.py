"""flare.apply_rope and its FlashInfer siblings on numpy arrays (the CPU reference): against a
float64 numpy rotation written from FlashInfer's documented formula, both pair layouts, a partial
rotary_dim, Llama 3.1's frequencies, indptr / offsets against pos_ids, the _inplace forms, and
argument errors naming the argument. No PyTorch, no GPU needed."""

import math

import numpy as np
import pytest

import flare


def frequencies(rotary_dim, rope_scale, rope_theta, llama31=None):
    """Radians per position of each pair (Llama 3.1: its smoothing between the factors)."""
    out = []
    for i in range(rotary_dim // 2):
        base = rope_theta ** (-2.0 * i / rotary_dim)
        if llama31 is None:
            out.append(base / rope_scale)
            continue
        low, high, old = llama31
        wavelength = 2 * math.pi / base
        if wavelength < old / high:
            out.append(base)
        elif wavelength > old / low:
            out.append(base / rope_scale)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append((1 - smooth) * base / rope_scale + smooth * base)
    return np.array(out)


def rotate(x, positions, rotary_dim, interleave, freq):
    """x [nnz, H, D] rotated in float64 at positions [nnz]."""
    out = x.astype(np.float64).copy()
    half = rotary_dim // 2
    a = np.arange(half) * 2 if interleave else np.arange(half)
    b = a + 1 if interleave else a + half
    angle = positions[:, None, None] * freq[None, None, :]
    xa, xb = out[:, :, a].copy(), out[:, :, b].copy()
    out[:, :, a] = xa * np.cos(angle) - xb * np.sin(angle)
    out[:, :, b] = xb * np.cos(angle) + xa * np.sin(angle)
    return out


def inputs(nnz=9, q_heads=4, k_heads=2, head_dim=32, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((nnz, q_heads, head_dim)).astype(dtype)
    k = rng.standard_normal((nnz, k_heads, head_dim)).astype(dtype)
    return q, k


INDPTR = np.array([0, 4, 4, 9], dtype=np.int32)
OFFSETS = np.array([3, 50, 1000], dtype=np.int32)
POSITIONS = np.array([3, 4, 5, 6, 1000, 1001, 1002, 1003, 1004])


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 16])
def test_apply_rope_matches_float64(interleave, rotary_dim):
    q, k = inputs()
    rd = rotary_dim or 32
    freq = frequencies(rd, 2.0, 500.0)
    q_rope, k_rope = flare.apply_rope(q, k, INDPTR, OFFSETS, rotary_dim=rotary_dim,
                                      interleave=interleave, rope_scale=2.0, rope_theta=500.0)
    np.testing.assert_allclose(q_rope, rotate(q, POSITIONS, rd, interleave, freq), atol=2e-6)
    np.testing.assert_allclose(k_rope, rotate(k, POSITIONS, rd, interleave, freq), atol=2e-6)
    np.testing.assert_array_equal(q_rope[:, :, rd:], q[:, :, rd:])  # the tail copied


def test_pos_ids_equal_indptr_and_offsets_and_inplace_equals_out_of_place():
    q, k = inputs(dtype=np.float16)
    q1, k1 = flare.apply_rope(q, k, INDPTR, OFFSETS)
    for ids in (POSITIONS.astype(np.int32), POSITIONS.astype(np.int64)):
        q2, k2 = flare.apply_rope_pos_ids(q, k, ids)
        np.testing.assert_array_equal(q1, q2)
        np.testing.assert_array_equal(k1, k2)
    q3, k3 = q.copy(), k.copy()
    assert flare.apply_rope_inplace(q3, k3, INDPTR, OFFSETS) is None
    np.testing.assert_array_equal(q3, q1)
    np.testing.assert_array_equal(k3, k1)
    q4, k4 = q.copy(), k.copy()
    flare.apply_rope_pos_ids_inplace(q4, k4, POSITIONS.astype(np.int32))
    np.testing.assert_array_equal(q4, q1)


def test_llama31_forms_use_llama31_frequencies():
    q, k = inputs(head_dim=64)
    freq = frequencies(64, 8.0, 5e5, (1.0, 4.0, 8192.0))
    q_rope, k_rope = flare.apply_llama31_rope(q, k, INDPTR, OFFSETS)
    np.testing.assert_allclose(q_rope, rotate(q, POSITIONS, 64, False, freq), atol=2e-6)
    q_ids, _ = flare.apply_llama31_rope_pos_ids(q, k, POSITIONS.astype(np.int32))
    np.testing.assert_array_equal(q_ids, q_rope)
    q2, k2 = q.copy(), k.copy()
    flare.apply_llama31_rope_inplace(q2, k2, INDPTR, OFFSETS)
    np.testing.assert_array_equal(q2, q_rope)
    q3, k3 = q.copy(), k.copy()
    flare.apply_llama31_rope_pos_ids_inplace(q3, k3, POSITIONS.astype(np.int64))
    np.testing.assert_array_equal(k3, k_rope)
    other = frequencies(64, 8.0, 5e5, (2.0, 8.0, 4096.0))
    q_other, _ = flare.apply_llama31_rope(q, k, INDPTR, OFFSETS, low_freq_factor=2,
                                          high_freq_factor=8, old_context_len=4096)
    np.testing.assert_allclose(q_other, rotate(q, POSITIONS, 64, False, other), atol=2e-6)


def test_errors_name_the_argument():
    q, k = inputs()
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        flare.apply_rope(q, k, INDPTR, OFFSETS, rotary_dim=7)
    with pytest.raises(ValueError, match="pos_ids must have shape"):
        flare.apply_rope_pos_ids(q, k, POSITIONS[:4].astype(np.int32))
    with pytest.raises(ValueError, match="indptr must start at 0 and end at nnz = 9"):
        flare.apply_rope(q, k, np.array([0, 4, 4, 8], dtype=np.int32), OFFSETS)
    with pytest.raises(ValueError, match="offsets dtype must be int32"):
        flare.apply_rope(q, k, INDPTR, OFFSETS.astype(np.int64))
    with pytest.raises(ValueError, match="k must have q's nnz"):
        flare.apply_rope(q, k[:5], INDPTR, OFFSETS)
    with pytest.raises(ValueError, match="float64"):
        flare.apply_rope(q.astype(np.float64), k.astype(np.float64), INDPTR, OFFSETS)


@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_forms_take_the_angles_from_the_table(is_neox):
    rotary_dim, head_size, rows = 16, 32, 64
    freq = frequencies(rotary_dim, 1.0, 1e4)
    angle = np.arange(rows)[:, None] * freq[None, :]
    table = np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)
    q, k = inputs(head_dim=head_size)
    positions = np.array([5, 0, 63, 7, 8, 9, 1, 2, 3], dtype=np.int64)
    query, key = q.reshape(9, -1), k.reshape(9, -1)
    q_out, k_out = flare.apply_rope_with_cos_sin_cache(positions, query, key, head_size, table,
                                                       is_neox=is_neox)
    assert q_out.shape == query.shape and k_out.shape == key.shape
    want = rotate(q, positions, rotary_dim, not is_neox, freq).reshape(9, -1)
    np.testing.assert_allclose(q_out, want, atol=2e-6)
    query2, key2 = query.copy(), key.copy()
    assert flare.apply_rope_with_cos_sin_cache_inplace(positions, query2, key2, head_size, table,
                                                       is_neox=is_neox) is None
    np.testing.assert_array_equal(query2, q_out)
    np.testing.assert_array_equal(key2, k_out)
    with pytest.raises(ValueError, match="outside cos_sin_cache's 64 rows"):
        flare.apply_rope_with_cos_sin_cache(positions + 60, query, key, head_size, table)
    with pytest.raises(ValueError, match="num_heads \\* head_size"):
        flare.apply_rope_with_cos_sin_cache(positions, query, key, 48, table)
