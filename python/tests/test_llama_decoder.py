"""flare.models.LlamaDecoder (issue 22): configs and the RoPE table without a GPU; on an sm_90
GPU, teacher-forced decode steps against the PyTorch reference (flare/_llama_reference.py,
same weights and rounding points) for several head sizes, GQA ratios, page sizes and ragged
prompt lengths, the K/V the kernel writes, CUDA-graph replay, and the device-side index checks;
the same with 4-bit weights against the reference over the dequantized weights.
"""

import math

import numpy as np
import pytest

import flare
from flare.models import LlamaConfig

try:
    import torch
except ImportError:  # the config and schedule tests need no torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def hf_llama3_inv_freq(theta, dim, factor, low, high, original):
    """Hugging Face's _compute_llama3_parameters in numpy float64."""
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def test_presets_and_rope_table_match_hugging_face():
    assert set(LlamaConfig.preset_names()) == {"llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b",
                                               "llama-3.2-3b"}
    for name in LlamaConfig.preset_names():
        c = LlamaConfig.preset(name)
        s = c.rope_scaling
        expected = hf_llama3_inv_freq(c.rope_theta, c.head_dim, s["factor"], s["low_freq_factor"],
                                      s["high_freq_factor"], s["original_max_position"])
        np.testing.assert_array_equal(np.array(c.rope_inv_freq(), dtype=np.float32), expected)


def test_from_hf_config_dict():
    hf = {"num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
          "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
          "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    c = LlamaConfig.from_hf(hf, name="llama-3.2-1b")
    assert c == LlamaConfig.preset("llama-3.2-1b")
    bad = LlamaConfig.from_hf(dict(hf, num_key_value_heads=5))
    with pytest.raises(ValueError, match="got 32 heads and 5 kv_heads"):
        bad.validate()


def test_schedule_without_a_gpu():
    c = LlamaConfig.preset("llama-3.1-8b")
    from dataclasses import asdict
    s = flare._flare.llama_decode_schedule(asdict(c), 1, 132, 232448 - 1024)
    assert s["stages"] == 11 and s["attention_splits"] == 16
    assert [o["name"] for o in s["operators"]] == ["qkv", "o", "gate_up", "down", "lm_head"]
    # Shares differ by at most one block of each operator: per layer 4 + 4 + 2 * 4 + 14 chunks
    # (qkv, o, gate and up, down), then 4 of the LM head.
    assert max(s["chunks_per_cta"]) - min(s["chunks_per_cta"]) == 32 * (4 + 4 + 8 + 14) + 4


def _sm90():
    return (torch is not None and torch.cuda.is_available() and flare.cuda_available()
            and torch.cuda.get_device_capability()[0] >= 9)


gpu = pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")


def tiny_config(head_dim, heads, kv_heads, layers=2, hidden=512, vocab=1000, intermediate=1408,
                weight_format="bf16"):
    return LlamaConfig(name="tiny", num_layers=layers, hidden=hidden, intermediate=intermediate,
                       heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
                       rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position": 64},
                       weight_format=weight_format)


def tiny_int4_config(head_dim, heads, kv_heads, intermediate=2048):
    """4-bit weights need hidden, intermediate and heads * head_dim multiples of 1024."""
    return tiny_config(head_dim, heads, kv_heads, hidden=1024, intermediate=intermediate,
                       weight_format="int4")


class Session:
    """A decoder and the reference over the same weights, requests with their own pages."""

    def __init__(self, config, prompt_lens, steps, page_size, seed=0):
        from flare._llama_reference import LlamaReference
        from flare.models import LlamaDecoder, random_llama_state_dict

        self.config = config
        self.sd = random_llama_state_dict(config, seed=seed)
        self.ref = LlamaReference(config, self.sd)
        gen = torch.Generator().manual_seed(seed)
        capacity = [p + steps + 1 for p in prompt_lens]
        pages = [-(-c // page_size) for c in capacity]
        total = sum(pages) + 3
        perm = torch.randperm(total, generator=gen).to(torch.int32)
        self.indptr = torch.tensor([0] + list(np.cumsum(pages)), dtype=torch.int32)
        self.indices = perm[: sum(pages)].contiguous()
        self.dec = LlamaDecoder(config, self.sd, num_pages=total, page_size=page_size)
        self.page_size = page_size
        self.lens = list(prompt_lens)
        self.caches = []
        self.last_logits = []
        for b, p in enumerate(prompt_lens):
            tokens = torch.randint(0, config.vocab, (p,), generator=gen).cuda()
            cache = self.ref.new_cache(capacity[b])
            self.last_logits.append(self.ref.forward(tokens, 0, cache)[-1])
            self.caches.append(cache)
            rows = self.rows(b, torch.arange(p))
            for layer in range(config.num_layers):
                self.dec.k_caches[layer].view(-1, config.kv_heads, config.head_dim)[rows] = cache[0][layer][:p]
                self.dec.v_caches[layer].view(-1, config.kv_heads, config.head_dim)[rows] = cache[1][layer][:p]

    def rows(self, b, positions):
        pages = self.indices[self.indptr[b] + positions // self.page_size].long()
        return (pages * self.page_size + positions % self.page_size).cuda()

    def device_tables(self):
        return self.indptr.cuda(), self.indices.cuda()

    def reference_step(self, tokens):
        out = []
        for b, t in enumerate(tokens.tolist()):
            out.append(self.ref.forward(torch.tensor([t], device="cuda"), self.lens[b], self.caches[b])[0])
        return torch.stack(out)


def rel_l2(a, b):
    return ((a - b).norm() / b.norm()).item()


TEACHER_FORCED_CASES = [
    # config, page size, prompt lengths
    (tiny_config(128, 8, 2), 16, [5, 37, 100]),
    (tiny_config(64, 8, 2), 1, [1, 64]),
    (tiny_config(128, 6, 2), 7, [300]),
    (tiny_config(128, 4, 4), 16, [3, 17, 29, 33, 40, 51, 70, 90]),
    (tiny_config(128, 8, 1), 16, [50, 3]),  # groups of 8: 4 dimensions a lane
    # 4-bit weights
    (tiny_int4_config(128, 8, 2), 16, [5, 37, 100]),
    (tiny_int4_config(64, 16, 2), 1, [1, 64]),  # head_dim 64, groups of 8
    (tiny_int4_config(128, 8, 1), 7, [130]),
    # batch 6 of an 8192-wide input: activations read from L2, not shared memory
    (tiny_int4_config(128, 8, 2, intermediate=8192), 16, [3, 17, 29, 33, 40, 51]),
]


@gpu
@pytest.mark.parametrize("config,page_size,prompt_lens", TEACHER_FORCED_CASES,
                         ids=lambda v: f"{v.weight_format}-d{v.head_dim}-g{v.heads // v.kv_heads}-"
                                       f"i{v.intermediate}" if isinstance(v, LlamaConfig) else None)
def test_teacher_forced_steps_match_the_reference(config, page_size, prompt_lens):
    head_dim, kv_heads = config.head_dim, config.kv_heads
    steps = 12
    s = Session(config, prompt_lens, steps, page_size)
    indptr, indices = s.device_tables()
    tokens = torch.stack([l.argmax() for l in s.last_logits]).to(torch.int32)
    for step in range(steps):
        positions = torch.tensor(s.lens, dtype=torch.int32, device="cuda")
        next_tokens = torch.full((len(prompt_lens),), -7, dtype=torch.int32, device="cuda")
        logits = torch.full((len(prompt_lens), config.vocab), float("nan"), device="cuda")
        s.dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits)
        expected = s.reference_step(tokens)
        assert s.dec.take_error() is None
        assert torch.isfinite(logits).all()
        for b in range(len(prompt_lens)):
            assert rel_l2(logits[b], expected[b]) < 2e-2, (step, b, rel_l2(logits[b], expected[b]))
            # The greedy token is the argmax of the kernel's own logits (lowest id on ties).
            assert next_tokens[b].item() == int(torch.argmax(logits[b]).item())
            # The K / V the step wrote equal the reference's (bf16; sums in another order).
            row = s.rows(b, torch.tensor([s.lens[b]]))
            for layer in range(config.num_layers):
                for cache, ref in ((s.dec.k_caches, s.caches[b][0]), (s.dec.v_caches, s.caches[b][1])):
                    got = cache[layer].view(-1, kv_heads, head_dim)[row][0].float()
                    want = ref[layer][s.lens[b]].float()
                    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)
        tokens = expected.argmax(-1).to(torch.int32)  # teacher forcing: the reference's tokens
        s.lens = [n + 1 for n in s.lens]


@gpu
def test_cuda_graph_replay_equals_eager():
    config = tiny_config(128, 8, 2)
    s = Session(config, [20, 9], 4, 16)
    indptr, indices = s.device_tables()
    tokens = torch.tensor([3, 4], dtype=torch.int32, device="cuda")
    positions = torch.tensor(s.lens, dtype=torch.int32, device="cuda")
    next_tokens = torch.empty(2, dtype=torch.int32, device="cuda")
    logits = torch.empty((2, config.vocab), device="cuda")
    s.dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits)
    eager = logits.clone()
    s.reference_step(tokens)  # the reference's caches now hold this step's K/V
    s.lens = [n + 1 for n in s.lens]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            s.dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits)
    logits.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(logits, eager, rtol=0, atol=0)  # the same step: bit-identical
    # New values in the same buffers: the next position.
    tokens.copy_(next_tokens)
    positions += 1
    logits.fill_(float("nan"))
    graph.replay()
    expected = s.reference_step(tokens.clone())
    for b in range(2):
        assert rel_l2(logits[b], expected[b]) < 2e-2
    assert s.dec.take_error() is None


@gpu
def test_sampling_in_the_kernel_and_in_a_graph():
    config = tiny_config(128, 8, 2)
    s = Session(config, [20, 9], 18, 16)  # pages for the 16 replays
    indptr, indices = s.device_tables()
    tokens = torch.tensor([3, 4], dtype=torch.int32, device="cuda")
    positions = torch.tensor(s.lens, dtype=torch.int32, device="cuda")
    next_tokens = torch.empty(2, dtype=torch.int32, device="cuda")
    logits = torch.empty((2, config.vocab), device="cuda")
    sampling = dict(temperature=5.0, top_k=5, seed=2026)
    s.dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits,
               **sampling)
    first = next_tokens.clone()
    s.dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens, logits=logits,
               **sampling)
    assert torch.equal(next_tokens, first)  # deterministic for a seed and position
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            s.dec.step(tokens, positions, indptr, indices, next_tokens=next_tokens,
                       logits=logits, **sampling)
    seen = set()
    for _ in range(16):  # the replays draw anew as the positions advance
        graph.replay()
        top5 = logits.topk(5, dim=-1).indices
        for b in range(2):
            assert next_tokens[b].item() in top5[b].tolist()
            seen.add((b, next_tokens[b].item()))
        positions += 1
    assert len(seen) > 2  # at temperature 5 the top 5 are near uniform
    assert s.dec.take_error() is None
    with pytest.raises(ValueError, match="temperature 0 is the greedy argmax"):
        s.dec.step(tokens, positions, indptr, indices, top_p=0.9)
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\]"):
        s.dec.step(tokens, positions, indptr, indices, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="seed must be an int"):
        s.dec.step(tokens, positions, indptr, indices, temperature=1.0, seed=-1)


@gpu
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.8, seed=5)])
def test_generate_equals_repeated_steps(sampling):
    config = tiny_config(128, 8, 2)
    s = Session(config, [20, 9], 6, 16)
    indptr, indices = s.device_tables()
    tokens = torch.tensor([3, 4], dtype=torch.int32, device="cuda")
    positions = torch.tensor(s.lens, dtype=torch.int32, device="cuda")
    looped, last_logits = s.dec.generate(tokens, positions, indptr, indices, 5, **sampling)
    assert looped.shape == (5, 2)
    steps = []
    for i in range(5):
        nxt, logits = s.dec.step(tokens, positions + i, indptr, indices, **sampling)
        steps.append(nxt.clone())
        tokens = nxt.clone()
    assert torch.equal(looped, torch.stack(steps))
    assert torch.equal(last_logits, logits)
    assert s.dec.take_error() is None
    with pytest.raises(ValueError, match="num_steps must be an int >= 1"):
        s.dec.generate(tokens, positions, indptr, indices, 0)


@gpu
def test_bad_indices_are_reported_and_nothing_is_written_outside():
    config = tiny_config(128, 8, 2)
    s = Session(config, [10], 2, 16)
    indptr, indices = s.device_tables()
    logits = torch.empty((1, config.vocab), device="cuda")
    snapshot = [k.clone() for k in s.dec.k_caches]
    # A token outside the vocabulary.
    s.dec.step(torch.tensor([config.vocab], dtype=torch.int32, device="cuda"),
               torch.tensor([10], dtype=torch.int32, device="cuda"), indptr, indices, logits=logits)
    assert "token id" in s.dec.take_error()
    # A position beyond the request's pages: no K/V write anywhere.
    for k, before in zip(s.dec.k_caches, snapshot):
        k.copy_(before)
    far = torch.tensor([16 * 5], dtype=torch.int32, device="cuda")
    s.dec.step(torch.tensor([1], dtype=torch.int32, device="cuda"), far, indptr, indices, logits=logits)
    assert "page table" in s.dec.take_error()
    for k, before in zip(s.dec.k_caches, snapshot):
        assert torch.equal(k, before)
    # A page id outside the cache.
    bad = indices.clone()
    bad[0] = s.dec.num_pages + 5
    s.dec.step(torch.tensor([1], dtype=torch.int32, device="cuda"),
               torch.tensor([10], dtype=torch.int32, device="cuda"), indptr, bad, logits=logits)
    assert "page" in s.dec.take_error()


@gpu
def test_argument_errors_name_the_argument():
    config = tiny_config(128, 8, 2)
    s = Session(config, [4], 1, 16)
    indptr, indices = s.device_tables()
    tokens = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="positions must be a contiguous int32 \\[2\\]"):
        s.dec.step(tokens, torch.tensor([4], dtype=torch.int32, device="cuda"), indptr, indices)
    with pytest.raises(ValueError, match="batch in \\[1, 8\\]"):
        s.dec.step(torch.zeros(9, dtype=torch.int32, device="cuda"),
                   torch.zeros(9, dtype=torch.int32, device="cuda"), indptr, indices)
    sd = dict(s.sd)
    sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"].float()
    from flare.models import LlamaDecoder
    with pytest.raises(ValueError, match="layers.1.mlp.up_proj.weight must be a contiguous"):
        LlamaDecoder(config, sd, num_pages=4)


@gpu
@pytest.mark.parametrize("weight_format", ["bf16", "int4"])
def test_llama_3_2_1b_shape_64_teacher_forced_steps(weight_format):
    config = LlamaConfig.preset("llama-3.2-1b")
    config.weight_format = weight_format
    steps = 64
    s = Session(config, [40], steps, 16)
    indptr, indices = s.device_tables()
    tokens = torch.stack([l.argmax() for l in s.last_logits]).to(torch.int32)
    worst = 0.0
    for _ in range(steps):
        positions = torch.tensor(s.lens, dtype=torch.int32, device="cuda")
        _, logits = s.dec.step(tokens, positions, indptr, indices)
        expected = s.reference_step(tokens)
        worst = max(worst, rel_l2(logits[0], expected[0]))
        tokens = expected.argmax(-1).to(torch.int32)
        s.lens = [n + 1 for n in s.lens]
    assert s.dec.take_error() is None
    assert worst < 2e-2, worst


@needs_torch
def test_int4_quantizer_matches_the_cpp_reference_bit_for_bit():
    from flare.models import dequantize_int4, quantize_int4

    gen = torch.Generator().manual_seed(5)
    w = torch.randn((7, 384), generator=gen) * 0.02
    w[0, :128] = 0.0        # a zero group: scale 0
    w[1, 3] = 0.5           # an outlier
    w[2, :128] = torch.arange(128) * 0.001 - 0.064  # halves to round (even)
    codes, scales = quantize_int4(w)
    ref_codes, ref_scales = flare._flare.quantize_int4(w.numpy().tobytes(), 7, 384)
    assert codes.numpy().tobytes() == ref_codes
    assert scales.view(torch.int16).numpy().tobytes() == ref_scales
    back = dequantize_int4(codes, scales)
    step = scales.float().repeat_interleave(128, dim=1)
    assert ((back - w).abs() <= 0.5 * step * (1 + 1 / 64)).all()
    with pytest.raises(ValueError, match="K a positive multiple of 128"):
        quantize_int4(torch.zeros(2, 100))


@needs_torch
def test_int4_state_dicts_configs_and_errors_without_a_gpu():
    from dataclasses import asdict

    from flare.models import (dequantize_int4, quantize_llama_int4, random_llama_state_dict,
                              weight_list)

    config = tiny_config(128, 8, 2, layers=1, hidden=1024, intermediate=2048, vocab=64)
    sd = random_llama_state_dict(config, device="cpu")
    int4_config, int4_sd = quantize_llama_int4(config, sd)
    assert int4_config.weight_format == "int4" and config.weight_format == "bf16"
    codes = int4_sd["model.layers.0.mlp.down_proj.weight_codes"]
    scales = int4_sd["model.layers.0.mlp.down_proj.weight_scales"]
    assert codes.dtype == torch.uint8 and list(codes.shape) == [1024, 1024]
    assert scales.dtype == torch.bfloat16 and list(scales.shape) == [1024, 16]
    assert "model.layers.0.mlp.down_proj.weight" not in int4_sd
    assert int4_sd["model.embed_tokens.weight"] is sd["model.embed_tokens.weight"]
    err = dequantize_int4(codes, scales) - sd["model.layers.0.mlp.down_proj.weight"].float()
    assert (err.abs() <= 0.5 * scales.float().repeat_interleave(128, 1) * 1.02).all()
    weights, scale_list = weight_list(int4_config, int4_sd)
    assert len(weights) == 3 + 9 and len(scale_list) == 7
    assert weights[3].dtype == torch.uint8 and weights[10].dtype == torch.bfloat16  # q; a norm
    # Random 4-bit weights made directly, with the spread of the bf16 ones.
    rnd = random_llama_state_dict(int4_config, device="cpu")
    w = dequantize_int4(rnd["model.layers.0.mlp.gate_proj.weight_codes"],
                        rnd["model.layers.0.mlp.gate_proj.weight_scales"])
    assert 0.015 < w.std().item() < 0.025
    # The format travels in the config; its shapes are checked.
    assert flare._flare.llama_validate(asdict(int4_config)) is None
    with pytest.raises(ValueError, match="hidden must be a multiple of 1024 for 4-bit"):
        tiny_config(128, 8, 2, weight_format="int4").validate()
    with pytest.raises(ValueError, match="weight format must be 'bf16' or 'int4', got 'int8'"):
        tiny_config(128, 8, 2, weight_format="int8").validate()
    with pytest.raises(KeyError, match="weight_format is 'int4' and the state dict has no"):
        weight_list(int4_config, sd)
    with pytest.raises(ValueError, match="already 'int4'"):
        quantize_llama_int4(int4_config, int4_sd)
    # A step reads 4.125 bits a projection weight (codes and scales) and the bf16 LM head.
    c8 = LlamaConfig.preset("llama-3.1-8b")
    c8.weight_format = "int4"
    assert abs(c8.step_weight_bytes() / 1e9 - 4.65) < 0.01
