"""FlashInfer's fp4_quantization helpers flare's NVFP4 KV caches need (torch tensors, CPU or
CUDA): e2m1_and_ufp8sf_scale_to_float dequantizes packed E2M1 pairs (the even element in the low
nibble) with one e4m3 (or UE8M0) scale per sf_vec_size values and a global scale, the format of
include/flare/format/nvfp4.h. Scale factors may be linear ([M, K / sf_vec_size]) or in the
128 x 4 swizzled layout of FlashInfer's GEMM quantizers; its 8 x 4 layout is not implemented
(NotImplementedError)."""

from ._tensors import torch_module

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

__all__ = ["e2m1_and_ufp8sf_scale_to_float"]


def _linear_scales(scales, m, groups):
    """Linear [m, groups] scale bytes from the 128 x 4 swizzled layout: rows padded to 128,
    groups to 4, stored as [m / 128][groups / 4][32][4][4] (row = 128 a + 32 i4 + i32, group
    = 4 b + j4 at [a][b][i32][i4][j4])."""
    padded_m = (m + 127) // 128 * 128
    padded_groups = (groups + 3) // 4 * 4
    if scales.numel() < padded_m * padded_groups:
        raise ValueError(f"e2m1_and_ufp8sf_scale_to_float: swizzled scales need "
                         f"{padded_m * padded_groups} bytes for {m} rows of {groups} blocks, "
                         f"got {scales.numel()}")
    tiles = scales.reshape(-1)[:padded_m * padded_groups].reshape(
        padded_m // 128, padded_groups // 4, 32, 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(padded_m, padded_groups)[:m, :groups]


def e2m1_and_ufp8sf_scale_to_float(e2m1_tensor, ufp8_scale_tensor, global_scale_tensor=None,
                                   sf_vec_size=16, ufp8_type=1, is_sf_swizzled_layout=True,
                                   is_sf_8x4_layout=False):
    """float32 [M, K] from packed E2M1 uint8 [M, K / 2] and scale bytes (uint8 or
    float8_e4m3fn): x = e2m1 * scale * global (global_scale_tensor: one float32, default 1).
    ufp8_type 1: e4m3 scales; 0: UE8M0 (2^(byte - 127)). On e2m1_tensor's device."""
    torch = torch_module()
    where = "e2m1_and_ufp8sf_scale_to_float"
    if is_sf_8x4_layout:
        raise NotImplementedError(f"{where}: the 8 x 4 swizzled scale layout is not implemented "
                                  "(linear and 128 x 4 are)")
    if e2m1_tensor.dtype != torch.uint8 or e2m1_tensor.ndim != 2:
        raise ValueError(f"{where}: e2m1_tensor must be uint8 [M, K / 2], got "
                         f"{e2m1_tensor.dtype} {tuple(e2m1_tensor.shape)}")
    if ufp8_type not in (0, 1):
        raise ValueError(f"{where}: ufp8_type must be 1 (e4m3) or 0 (UE8M0), got {ufp8_type}")
    m, k = e2m1_tensor.shape[0], e2m1_tensor.shape[1] * 2
    if sf_vec_size < 1 or k % sf_vec_size != 0:
        raise ValueError(f"{where}: K = {k} must be a multiple of sf_vec_size = {sf_vec_size}")
    groups = k // sf_vec_size
    device = e2m1_tensor.device
    scale_bytes = ufp8_scale_tensor.to(device)
    if scale_bytes.dtype != torch.uint8:
        scale_bytes = scale_bytes.view(torch.uint8)
    if is_sf_swizzled_layout:
        scale_bytes = _linear_scales(scale_bytes, m, groups)
    else:
        scale_bytes = scale_bytes.reshape(m, -1)
        if scale_bytes.shape[1] != groups:
            raise ValueError(f"{where}: linear scales must be [{m}, {groups}], got "
                             f"{tuple(ufp8_scale_tensor.shape)}")
    if ufp8_type == 1:
        scales = scale_bytes.contiguous().view(torch.float8_e4m3fn).float()
    else:
        scales = torch.pow(2.0, scale_bytes.float() - 127.0)
    codes = torch.stack([e2m1_tensor & 0x0F, e2m1_tensor >> 4], dim=-1).reshape(m, k)
    values = torch.tensor(_E2M1, dtype=torch.float32, device=device)[codes.long()]
    out = values * scales.repeat_interleave(sf_vec_size, dim=1)
    if global_scale_tensor is not None:
        out = out * global_scale_tensor.to(device=device, dtype=torch.float32).reshape(())
    return out
