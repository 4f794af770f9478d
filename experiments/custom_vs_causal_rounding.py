"""How far apart flare's custom-mask and causal prefill are on FlashInfer's
test_batch_prefill_with_ragged_kv_cache_custom_mask shapes (custom mask = the causal triangle),
and how far each is from an exact float64 reference, next to the error of an ideal one-pass
kernel that rounds P to fp16 once against the final row max and its output to fp16 (the floor
any fp16-P kernel shares). FlashInfer's test asserts |custom - causal| <= 1e-3 + 1e-3 |causal|;
its plan does not depend on the mask, so its two runs round identically; flare's plans are
mask-aware.

Usage (GPU, flare installed: scripts/gpu_check_python.sh): python3 custom_vs_causal_rounding.py
"""


import torch

import flare

DEVICE = torch.device("cuda:0")


def slopes(num_heads):
    return 2.0 ** (-8.0 * (torch.arange(num_heads, device=DEVICE, dtype=torch.float64) + 1) /
                   num_heads)


def exact_and_ideal(q, k, v, qo_len, kv_len, alibi, soft_cap):
    """(float64 exact o, o of a one-pass kernel rounding P = exp(s - max) to fp16) of one
    request; q [qo, H, D], k / v [kv, H_kv, D]."""
    heads, group = q.shape[1], q.shape[1] // k.shape[1]
    qd, kd, vd = (x.double() for x in (q, k, v))
    kd, vd = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    logits = torch.einsum("qhd,khd->hqk", qd, kd) / q.shape[2] ** 0.5
    q_pos = torch.arange(qo_len, device=DEVICE) + kv_len - qo_len
    kv_pos = torch.arange(kv_len, device=DEVICE)
    if alibi:
        logits = logits + slopes(heads)[:, None, None] * (kv_pos[None, None, :] -
                                                           q_pos[None, :, None])
    if soft_cap:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    logits = logits.masked_fill(kv_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    p = torch.exp(logits - logits.amax(-1, keepdim=True))
    denominator = p.sum(-1, keepdim=True)
    exact = torch.einsum("hqk,khd->qhd", p / denominator, vd)
    # fp16 P against the final max, float64 sums, the output rounded to fp16 as flare's is
    ideal = torch.einsum("hqk,khd->qhd", p.half().double() / denominator, vd).half().double()
    return exact, ideal


def fails(a, b):
    return int(((a - b).abs() > 1e-3 + 1e-3 * b.abs()).sum())


def main():
    print(torch.cuda.get_device_name(0))
    print("batch qo kv heads D mode cap seed | max|cu-ca| fails(cu vs ca) | max|cu-ex| "
          "max|ca-ex| max|ideal-ex| | fails vs exact: cu ca ideal")
    ws = torch.empty(256 << 20, dtype=torch.int8, device=DEVICE)
    for batch, qo_len, kv_len, heads, head_dim, mode, cap in [
            (12, 127, 2048, 32, 256, "ALIBI", 0.0), (17, 577, 2048, 32, 256, "ALIBI", 0.0),
            (17, 577, 2048, 32, 256, "ALIBI", 30.0), (128, 37, 512, 32, 256, "ALIBI", 0.0),
            (17, 577, 2048, 32, 128, "ALIBI", 0.0), (17, 577, 2048, 32, 256, "NONE", 0.0)]:
        for seed in (0, 1):
            torch.manual_seed(seed)
            q = torch.randn(batch * qo_len, heads, head_dim, device=DEVICE, dtype=torch.half)
            k = torch.randn(batch * kv_len, 4, head_dim, device=DEVICE, dtype=torch.half)
            v = torch.randn(batch * kv_len, 4, head_dim, device=DEVICE, dtype=torch.half)
            q_indptr = torch.arange(batch + 1, device=DEVICE, dtype=torch.int32) * qo_len
            kv_indptr = torch.arange(batch + 1, device=DEVICE, dtype=torch.int32) * kv_len
            mask = torch.tril(torch.ones(batch, qo_len, kv_len, dtype=torch.bool, device=DEVICE),
                              diagonal=kv_len - qo_len).reshape(-1)
            wrapper = flare.prefill.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            common = dict(pos_encoding_mode=mode, logits_soft_cap=cap)
            wrapper.plan(q_indptr, kv_indptr, heads, 4, head_dim, custom_mask=mask, **common)
            custom = wrapper.run(q, k, v).double()
            wrapper.plan(q_indptr, kv_indptr, heads, 4, head_dim, causal=True, **common)
            causal = wrapper.run(q, k, v).double()
            worst = [0.0, 0.0, 0.0]
            counts = [fails(custom, causal), 0, 0, 0]
            for b in range(batch):
                rows = slice(b * qo_len, (b + 1) * qo_len)
                keys = slice(b * kv_len, (b + 1) * kv_len)
                exact, ideal = exact_and_ideal(q[rows], k[keys], v[keys], qo_len, kv_len,
                                               mode == "ALIBI", cap)
                for i, got in enumerate((custom[rows], causal[rows], ideal)):
                    worst[i] = max(worst[i], float((got - exact).abs().max()))
                    counts[1 + i] += fails(got, exact)
            print(f"{batch} {qo_len} {kv_len} {heads} {head_dim} {mode} {cap} {seed} | "
                  f"{float((custom - causal).abs().max()):.2e} {counts[0]} | "
                  f"{worst[0]:.2e} {worst[1]:.2e} {worst[2]:.2e} | {counts[1]} {counts[2]} "
                  f"{counts[3]}", flush=True)


if __name__ == "__main__":
    main()
