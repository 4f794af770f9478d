"""A plain PyTorch Llama (the reference of flare.models.LlamaDecoder's tests and benchmark).

Same weights (4-bit ones dequantized to float32, unrounded, as the kernel uses them), bf16
storage, float32 accumulation, and the kernel's rounding points
(kernels/llama_decode.cuh): a float32 residual stream; RMSNorm(x) W^T computed as
rsqrt(mean(x^2) + eps) * (bf16(gamma * x) W^T) (Hugging Face's LlamaRMSNorm rounds
x * rsqrt(...) to bf16 before gamma: the same math, one rounding fewer); float32 products of
bf16 inputs; RoPE on the
float32 q / k with the float32 angle position * inv_freq (inv_freq with Llama 3's scaling, the
decoder's table); K and V rounded to bf16 (the cache), the attention output and
SiLU(gate) * up rounded to bf16; float32 logits. K/V live in dense per-request tensors.
"""

import torch


class LlamaReference:
    def __init__(self, config, state_dict):
        from .models import dequantize_int4, weight_list

        self.config = config
        w, scales = weight_list(config, state_dict)
        self.embed, self.final_norm = w[0], w[1]
        self.lm_head = w[2].float()
        self.layers = []
        for layer in range(config.num_layers):
            t = w[3 + 9 * layer: 12 + 9 * layer]
            if scales:  # 4-bit: scale * (q - 8) in float32, unrounded, as the kernel uses them
                s = scales[7 * layer: 7 * layer + 7]
                proj = [dequantize_int4(t[i], s[i]) for i in range(7)]
            else:
                proj = [t[i].float() for i in range(7)]
            self.layers.append({"q": proj[0], "k": proj[1], "v": proj[2], "o": proj[3],
                                "gate": proj[4], "up": proj[5], "down": proj[6],
                                "attn_norm": t[7], "mlp_norm": t[8]})
        self.inv_freq = torch.tensor(config.rope_inv_freq(), dtype=torch.float32,
                                     device=self.embed.device)

    def normed_product(self, x, gamma, weights):
        """RMSNorm(x) @ weights.T as the kernel forms it (float32 [T, out])."""
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_eps)
        return scale * ((gamma.float() * x).to(torch.bfloat16).float() @ weights.T)

    def rope(self, x, positions):
        angle = positions.float()[:, None] * self.inv_freq[None, :]  # float32, as the kernel
        cos, sin = torch.cos(angle)[:, None, :], torch.sin(angle)[:, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def new_cache(self, max_len, device=None):
        c = self.config
        shape = (max_len, c.kv_heads, c.head_dim)
        device = device or self.embed.device
        return ([torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(c.num_layers)],
                [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(c.num_layers)])

    @torch.no_grad()
    def forward(self, tokens, start, cache):
        """One request's tokens [T] at positions start..start+T-1 (causal); K/V into `cache`
        (from new_cache) at those positions. Returns float32 logits [T, vocab]."""
        c = self.config
        k_cache, v_cache = cache
        T, D, G = tokens.shape[0], c.head_dim, c.heads // c.kv_heads
        positions = torch.arange(start, start + T, device=tokens.device)
        x = self.embed[tokens.long()].float()
        for layer, w in enumerate(self.layers):
            q = self.rope(self.normed_product(x, w["attn_norm"], w["q"]).view(T, c.heads, D), positions)
            k = self.rope(self.normed_product(x, w["attn_norm"], w["k"]).view(T, c.kv_heads, D), positions)
            v = self.normed_product(x, w["attn_norm"], w["v"]).view(T, c.kv_heads, D)
            k_cache[layer][start:start + T] = k.to(torch.bfloat16)
            v_cache[layer][start:start + T] = v.to(torch.bfloat16)
            keys = k_cache[layer][:start + T].float().repeat_interleave(G, dim=1)    # [S, H, D]
            values = v_cache[layer][:start + T].float().repeat_interleave(G, dim=1)
            scores = torch.einsum("thd,shd->hts", q, keys) / D ** 0.5
            visible = torch.arange(start + T, device=tokens.device)[None, :] <= positions[:, None]
            scores = scores.masked_fill(~visible[None], float("-inf"))
            o = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), values)
            x = x + o.reshape(T, c.heads * D).to(torch.bfloat16).float() @ w["o"].T
            gate = self.normed_product(x, w["mlp_norm"], w["gate"])
            up = self.normed_product(x, w["mlp_norm"], w["up"])
            h = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
            x = x + h @ w["down"].T
        return self.normed_product(x, self.final_norm, self.lm_head)
