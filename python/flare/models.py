"""Whole-model decoding (issue 22): a Llama decode step as one persistent CUDA kernel.

``LlamaDecoder`` takes a Hugging Face Llama state dict (bf16 CUDA tensors, used in place, no
copy; or with 4-bit projection weights, ``quantize_llama_int4``) and owns a paged KV cache:
one K and one V tensor per layer, ``[num_pages, page_size, kv_heads, head_dim]`` bf16 (flare's NHD paged layout, one page table
shared by all layers). ``step()`` runs the whole model for one token per request (1 to 8
requests): it appends the tokens' K and V at their positions and returns float32 logits and the
greedy next tokens. A step launches one memset and one kernel on torch's current stream and can
be captured in a CUDA graph (static input tensors, new values each replay).

Needs an sm_90 GPU (the weight pipeline uses bulk async copies). Index data is on the device
and checked there: a token id outside the vocabulary or a position the page table does not
cover is skipped and reported by ``take_error()`` (which synchronizes).
"""

from dataclasses import asdict, dataclass, field
from typing import Optional

from . import _flare

__all__ = ["LlamaConfig", "LlamaDecoder", "random_llama_state_dict", "DECODE_ERRORS",
           "quantize_int4", "dequantize_int4", "quantize_llama_int4"]

DECODE_ERRORS = {
    0: None,
    1: "a token id outside [0, vocab): its embedding was read as zeros",
    2: "a position its page table does not cover, or a page id outside [0, num_pages): that "
       "K/V write and those reads were skipped",
    3: "a CTA waited 10 s for another: the step trapped",
}


@dataclass
class LlamaConfig:
    """A Llama model's shape (the fields of Hugging Face's LlamaConfig that decoding uses)."""

    name: str
    num_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    rope_scaling: Optional[dict] = field(default=None)  # llama3: factor, low/high_freq_factor,
    #                                                     original_max_position
    weight_format: str = "bf16"  # the layers' projections: "bf16", or "int4" (4-bit codes and
    #                              bf16 scales per 128 columns: quantize_int4's format)

    @staticmethod
    def preset(name):
        """"llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b" or "llama-3.2-3b"."""
        return LlamaConfig(**_flare.llama_preset(name))

    @staticmethod
    def preset_names():
        return list(_flare.llama_preset_names())

    @staticmethod
    def from_hf(hf_config, name="hf"):
        """From a transformers LlamaConfig (or its dict)."""
        c = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        scaling = c.get("rope_scaling")
        if scaling is not None:
            if scaling.get("rope_type", scaling.get("type")) != "llama3":
                raise NotImplementedError(f"LlamaConfig.from_hf: rope_scaling {scaling} (only llama3)")
            scaling = {"factor": scaling["factor"], "low_freq_factor": scaling["low_freq_factor"],
                       "high_freq_factor": scaling["high_freq_factor"],
                       "original_max_position": scaling["original_max_position_embeddings"]}
        heads = c["num_attention_heads"]
        return LlamaConfig(
            name=name, num_layers=c["num_hidden_layers"], hidden=c["hidden_size"],
            intermediate=c["intermediate_size"], heads=heads,
            kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads, vocab=c["vocab_size"],
            rope_theta=c.get("rope_theta", 10000.0), rms_eps=c.get("rms_norm_eps", 1e-6),
            tie_embeddings=c.get("tie_word_embeddings", False), rope_scaling=scaling)

    def validate(self):
        _flare.llama_validate(asdict(self))

    def step_weight_bytes(self):
        """Bytes of weights one decode step reads (projections, norms, LM head; not the
        embedding, of which a step reads one row per request)."""
        return _flare.llama_step_weight_bytes(asdict(self))

    def rope_inv_freq(self):
        """inv_freq [head_dim / 2] (float32 values) with Llama 3's scaling, as the kernel uses."""
        return list(_flare.llama_rope_inv_freq(asdict(self)))


_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_LAYER_NAMES = _PROJECTIONS + ("input_layernorm", "post_attention_layernorm")


def _state_tensor(state_dict, key):
    for k in (key, key[len("model."):] if key.startswith("model.") else "model." + key):
        if k in state_dict:
            return state_dict[k]
    raise KeyError(f"LlamaDecoder: the state dict has no '{key}'")


def weight_list(config, state_dict):
    """The state dict's tensors in the order the extension takes them: (weights, scales).

    weights: embed, norm, lm_head, then per layer the 7 projections (bf16 ``.weight``, or for
    weight_format "int4" the uint8 ``.weight_codes``) and the 2 norms; scales: for "int4" the 7
    projections' bf16 ``.weight_scales`` per layer, else empty.
    """
    embed = _state_tensor(state_dict, "model.embed_tokens.weight")
    if config.tie_embeddings or "lm_head.weight" not in state_dict:
        if not config.tie_embeddings:
            raise KeyError("LlamaDecoder: the state dict has no 'lm_head.weight' and the config "
                           "does not tie embeddings")
        lm_head = embed
    else:
        lm_head = state_dict["lm_head.weight"]
    if config.weight_format not in ("bf16", "int4"):
        raise ValueError(f"LlamaDecoder: weight_format must be 'bf16' or 'int4', got "
                         f"{config.weight_format!r}")
    int4 = config.weight_format == "int4"
    out = [embed, _state_tensor(state_dict, "model.norm.weight"), lm_head]
    scales = []
    for layer in range(config.num_layers):
        for name in _LAYER_NAMES:
            key = f"model.layers.{layer}.{name}."
            if int4 and name in _PROJECTIONS:
                try:
                    out.append(_state_tensor(state_dict, key + "weight_codes"))
                except KeyError:
                    raise KeyError(f"LlamaDecoder: the config's weight_format is 'int4' and the "
                                   f"state dict has no '{key}weight_codes' (quantize_llama_int4 "
                                   f"makes one)") from None
                scales.append(_state_tensor(state_dict, key + "weight_scales"))
            else:
                out.append(_state_tensor(state_dict, key + "weight"))
    return out, scales


class LlamaDecoder:
    """One decode step of a Llama model per call, as one persistent kernel (FlashFormer).

    Args:
      config: LlamaConfig.
      state_dict: Hugging Face names (``model.layers.0.self_attn.q_proj.weight``, ...), bf16
        contiguous CUDA tensors on one sm_90 device; kept referenced, never copied. With
        ``config.weight_format == "int4"`` each projection is ``<name>.weight_codes`` (uint8
        [out, in / 2]) and ``<name>.weight_scales`` (bf16 [out, in / 128]) instead of
        ``<name>.weight`` (quantize_llama_int4; hidden, intermediate and heads * head_dim must
        be multiples of 1024).
      num_pages, page_size: the paged KV cache this decoder allocates (zeros), per layer
        ``k_caches[l]`` / ``v_caches[l]`` of shape [num_pages, page_size, kv_heads, head_dim].
    """

    def __init__(self, config, state_dict, *, num_pages, page_size=16):
        import torch

        config.validate()
        self.config = config
        self._weights, self._scales = weight_list(config, state_dict)
        device = self._weights[0].device
        if device.type != "cuda":
            raise ValueError(f"LlamaDecoder: weights must be CUDA tensors, got {device}")
        shape = (num_pages, page_size, config.kv_heads, config.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device)
                         for _ in range(config.num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device)
                         for _ in range(config.num_layers)]
        self.page_size = page_size
        self.num_pages = num_pages
        self.device = device
        with torch.cuda.device(device):
            self._impl = _flare.LlamaDecoder(asdict(config), self._weights, self._scales,
                                             self.k_caches, self.v_caches)

    def step(self, tokens, positions, kv_indptr, kv_indices, *, next_tokens=None, logits=None,
             temperature=0.0, top_k=0, top_p=1.0, seed=0):
        """Runs the model on one token per request; returns (next_tokens, logits).

        tokens, positions: int32 [batch] CUDA tensors (positions[b]: the tokens already in
        request b's cache); kv_indptr int32 [batch + 1] and kv_indices int32 [nnz]: request b's
        pages, covering positions[b] + 1 tokens. next_tokens (int32 [batch]) and logits (float32
        [batch, vocab]) are written in place when given (CUDA-graph capture), else allocated.

        next_tokens: with temperature 0 the argmax of each request's logits (the lowest id on
        ties); with temperature >= 1e-5 a sample of softmax(logits / temperature) restricted to the
        top_k most likely tokens (0: all) and the smallest most-likely set of mass top_p (1: all),
        drawn in the same kernel launch (flare/model/sampling.h). The draws are a function of
        (seed, the request's slot, its position, the token id), so a step is deterministic and a
        replayed CUDA graph draws anew as the positions advance. -1 when every logit is NaN.
        """
        import torch

        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"LlamaDecoder.step: seed must be an int in [0, 2**64), got {seed!r}")

        batch = tokens.shape[0] if tokens.dim() == 1 else -1
        if next_tokens is None:
            next_tokens = torch.empty(max(batch, 0), dtype=torch.int32, device=self.device)
        if logits is None:
            logits = torch.empty((max(batch, 0), self.config.vocab), dtype=torch.float32,
                                 device=self.device)
        self._impl.step(tokens, positions, kv_indptr, kv_indices, next_tokens, logits,
                        float(temperature), int(top_k), float(top_p), seed)
        return next_tokens, logits

    def generate(self, tokens, positions, kv_indptr, kv_indices, num_steps, *, step_tokens=None,
                 logits=None, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        """Runs num_steps decode steps in one kernel launch (the GPU-side loop); returns
        (step_tokens, logits).

        Step i feeds step i - 1's next tokens (tokens for i = 0) at positions[b] + i, so each
        request's pages (kv_indptr / kv_indices) must cover positions[b] + num_steps tokens.
        step_tokens int32 [num_steps, batch] receives every step's next tokens, greedy or sampled
        as in step() (the same draws: the tokens equal num_steps step() calls); logits float32
        [batch, vocab] the last step's. Both are written in place when given, else allocated.
        """
        import torch

        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"LlamaDecoder.generate: seed must be an int in [0, 2**64), got "
                             f"{seed!r}")
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"LlamaDecoder.generate: num_steps must be an int >= 1, got "
                             f"{num_steps!r}")
        batch = tokens.shape[0] if tokens.dim() == 1 else -1
        if step_tokens is None:
            step_tokens = torch.empty((num_steps, max(batch, 0)), dtype=torch.int32,
                                      device=self.device)
        if logits is None:
            logits = torch.empty((max(batch, 0), self.config.vocab), dtype=torch.float32,
                                 device=self.device)
        self._impl.generate(tokens, positions, kv_indptr, kv_indices, num_steps, step_tokens,
                            logits, float(temperature), int(top_k), float(top_p), seed)
        return step_tokens, logits

    def prepare(self, batch):
        """Compiles and loads the kernel of this batch size now (a batch's first step does it
        otherwise; the constructor does batch 1)."""
        self._impl.prepare(batch)

    def take_error(self):
        """Synchronizes; the first device-side error since the last call (a message) or None."""
        return DECODE_ERRORS[self._impl.take_error()]

    def schedule(self, batch=1):
        """How the step's work is split over the SMs (blocks, chunks, stages, KV splits)."""
        return self._impl.schedule(batch)


def random_llama_state_dict(config, device="cuda", seed=0, std=0.02):
    """Random weights of the exact shapes (Hugging Face names), norms near 1: bf16, or for
    ``config.weight_format == "int4"`` random 4-bit codes with scales of the same spread
    (made directly: the 70B's bf16 weights would not fit one GPU)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape, mean=0.0, s=std):
        t = torch.empty(shape, dtype=torch.bfloat16, device=device)
        return t.normal_(mean, s, generator=gen)

    def projection(sd, key, rows, cols):
        if config.weight_format != "int4":
            sd[key + "weight"] = normal(rows, cols)
            return
        codes = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, device=device,
                              generator=gen)
        # uniform codes: std(q - 8) = 4.61; scales spread 20% around std / 4.61
        scales = normal(rows, cols // INT4_GROUP_SIZE, mean=std / 4.61, s=0.2 * std / 4.61)
        sd[key + "weight_codes"], sd[key + "weight_scales"] = codes, scales

    h, d = config.hidden, config.head_dim
    sd = {"model.embed_tokens.weight": normal(config.vocab, h, s=1.0),
          "model.norm.weight": normal(h, mean=1.0, s=0.05)}
    if not config.tie_embeddings:
        sd["lm_head.weight"] = normal(config.vocab, h)
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        projection(sd, p + "self_attn.q_proj.", config.heads * d, h)
        projection(sd, p + "self_attn.k_proj.", config.kv_heads * d, h)
        projection(sd, p + "self_attn.v_proj.", config.kv_heads * d, h)
        projection(sd, p + "self_attn.o_proj.", h, config.heads * d)
        projection(sd, p + "mlp.gate_proj.", config.intermediate, h)
        projection(sd, p + "mlp.up_proj.", config.intermediate, h)
        projection(sd, p + "mlp.down_proj.", h, config.intermediate)
        sd[p + "input_layernorm.weight"] = normal(h, mean=1.0, s=0.05)
        sd[p + "post_attention_layernorm.weight"] = normal(h, mean=1.0, s=0.05)
    return sd


INT4_GROUP_SIZE = 128


def quantize_int4(weight):
    """4-bit weight-only quantization of a [N, K] weight (flare/model/int4_weights.h's format).

    Symmetric, group size 128 along K, bf16 scales, round to nearest: scale = bf16(max|w| / 7)
    per row and group, code = clamp(round_half_even(w / scale), -8, 7) + 8. Returns (codes uint8
    [N, K / 2]: column 2j in the low nibble of byte j, 2j + 1 in the high one; scales bf16
    [N, K / 128]) on the weight's device; dequantize_int4 gives the reference's weights.
    """
    import torch

    if weight.dim() != 2 or weight.shape[1] % INT4_GROUP_SIZE != 0 or weight.shape[1] == 0:
        raise ValueError(f"quantize_int4: weight must be [N, K] with K a positive multiple of "
                         f"{INT4_GROUP_SIZE}, got {list(weight.shape)}")
    w = weight.float()
    if not torch.isfinite(w).all():
        raise ValueError("quantize_int4: the weight has non-finite values")
    rows, cols = w.shape
    groups = w.view(rows, cols // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
    scales = (groups.abs().amax(dim=-1) / 7).to(torch.bfloat16)
    s = scales.float()[..., None]
    q = torch.where(s > 0, torch.round(groups / s), torch.zeros_like(groups))
    code = (q.clamp(-8, 7) + 8).to(torch.uint8).view(rows, cols)
    codes = code[:, 0::2] | (code[:, 1::2] << 4)
    return codes.contiguous(), scales.contiguous()


def dequantize_int4(codes, scales):
    """float32 [N, K] weights of a 4-bit weight (exact: scale * (code - 8))."""
    import torch

    rows = codes.shape[0]
    low = (codes & 0x0F).to(torch.int32)
    high = (codes >> 4).to(torch.int32)
    code = torch.stack([low, high], dim=-1).view(rows, -1)
    scale = scales.float().repeat_interleave(INT4_GROUP_SIZE, dim=1)
    return scale * (code - 8).float()


def quantize_llama_int4(config, state_dict):
    """A 4-bit copy of a bf16 Llama state dict: (config with weight_format "int4", state dict).

    Each layer's 7 projections become ``<name>.weight_codes`` and ``<name>.weight_scales``
    (quantize_int4); the embedding, the norms and the LM head are the same tensors (not copied).
    """
    from dataclasses import replace

    if config.weight_format != "bf16":
        raise ValueError(f"quantize_llama_int4: the config's weights are already "
                         f"{config.weight_format!r}")
    int4_config = replace(config, weight_format="int4")
    int4_config.validate()
    out = {}
    for key, tensor in state_dict.items():
        name = key[:-len(".weight")] if key.endswith(".weight") else None
        if name is not None and any(name.endswith(p) for p in _PROJECTIONS) and ".layers." in key:
            out[name + ".weight_codes"], out[name + ".weight_scales"] = quantize_int4(tensor)
        else:
            out[key] = tensor
    return int4_config, out
