import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(64, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(64, 8, 8192, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(3): F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
