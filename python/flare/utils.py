"""FlashInfer's flashinfer.utils names that callers and FlashInfer's tests use: the mode enums,
the GPU capability queries and the architecture exception. The `is_sm*_supported` queries say
whether the device is of that architecture: flare compiles its kernels for the device it runs
on (NVRTC), so no toolkit version gates them."""

from enum import Enum


class PosEncodingMode(Enum):
    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class MaskMode(Enum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class TensorLayout(Enum):
    NHD = 0
    HND = 1


class GPUArchitectureError(Exception):
    """An operation the GPU's architecture cannot run (FlashInfer's name; tests skip on it)."""


def get_compute_capability(device):
    """(major, minor) of a CUDA torch device; ValueError for another device."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"get_compute_capability: device must be a cuda device, got {device}")
    return torch.cuda.get_device_capability(device)


def _major(device):
    return get_compute_capability(device)[0]


def is_sm90a_supported(device):
    """Hopper (compute capability 9.x)."""
    return _major(device) == 9


def is_sm100a_supported(device):
    """Blackwell data-center GPUs (compute capability 10.x)."""
    return _major(device) == 10


def is_sm12x_supported(device):
    """Blackwell consumer GPUs (compute capability 12.x)."""
    return _major(device) == 12
