// `flare attention`: one batch attention call on tensors read from .npy files, written back
// as o.npy and lse.npy — how anyone reproduces a flare result from plain NumPy arrays.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "flare/core/error.h"
#include "flare/format/paged_kv.h"
#include "flare/format/ragged.h"
#include "flare/format/validate.h"
#include "flare/reference/attention.h"
#include "tools/flare/args.h"
#include "tools/flare/commands.h"
#include "tools/flare/gpu_decode.h"
#include "tools/flare/gpu_prefill.h"
#include "tools/flare/npy.h"

namespace flare::cli {
namespace {

constexpr const char* kHelp =
    R"(usage: flare attention --q Q.npy --k K.npy --v V.npy --qo-indptr QO.npy
                       --kv-indptr KV.npy [--kv-indices I.npy --kv-last-page-len L.npy]
                       --out-dir DIR [options]

Batch attention over ragged queries and a paged or ragged KV cache, as the library computes
it. Writes DIR/o.npy (float32 [total_q, H_qo, D_vo]) and DIR/lse.npy (float32
[total_q, H_qo], natural-log log-sum-exp of the scaled logits; with --sigmoid there is
none, and an lse.npy left in DIR by an earlier run is removed).
Nothing is written when an input is malformed.

tensors (.npy, little-endian, C order; float data '<f4' or '<f2')
  --q FILE                  [total_q, H_qo, D_qk]; request i owns rows qo_indptr[i]..[i+1]
  --k FILE, --v FILE        paged (with --kv-indices):
                              NHD [pages, page_size, H_kv, D]  or  HND [pages, H_kv, page_size, D]
                            ragged (without): [total_kv, H_kv, D]
                            D_qk and D_vo are multiples of 8 up to 256; H_qo a multiple of H_kv.
                            With an fp8 --kv-dtype, '|u1' files hold raw fp8 bit patterns.
  --qo-indptr FILE          int32 or int64 [batch + 1], non-decreasing from 0
  --kv-indptr FILE          int [batch + 1]: pages per request (paged) or KV rows (ragged)
  --kv-indices FILE         int [kv_indptr[batch]]: page ids in [0, pages), selects paged KV
  --kv-last-page-len FILE   int [batch]: valid slots of each request's last page, 1..page_size
  --page-size N             paged only: checked against the shape of --k
  --layout NHD|HND          paged page layout (default NHD)
  (int64 index arrays, NumPy's default, are narrowed to int32 with a range check)

options
  --causal                  query i of a request with q_len queries and kv_len keys sees
                            keys j <= kv_len - q_len + i (bottom-right aligned)
  --window-left N           also hide keys j < q_pos - N (sliding window)
  --custom-mask FILE        '|u1': packed bits (np.packbits(..., bitorder='little')) of each
                            request's q_len x kv_len row-major mask, starting at byte
                            mask_indptr[i]; needs --mask-indptr. '|b1': the unpacked masks of
                            all requests concatenated (flattened), packed here. Set = visible.
  --mask-indptr FILE        int [batch + 1]: byte offsets into a packed --custom-mask
  --sm-scale X              logits scale (default 1/sqrt(D_qk))
  --soft-cap X              logits <- X * tanh(logits / X)
  --alibi                   logits += slope[h] * (j - q_pos)
  --alibi-slopes FILE       float32 [H_qo] (default: the ALiBi paper's slopes)
  --rope                    llama-style RoPE (rotate half) on q and k at their positions
  --rope-theta X            (default 10000)
  --rope-scale X            positions are divided by X (default 1)
  --rope-offsets FILE       int [batch]: added to every position of the request
  --sigmoid                 sigmoid(logits + bias) weights instead of softmax (no lse)
  --sigmoid-bias X          (default 0)

types and backend
  --dtype f32|f16|bf16      q, k, v are rounded to this type before the call (NumPy has no
                            bfloat16: pass float32 files with --dtype bf16); default: the
                            type of the q file
  --kv-dtype f32|f16|bf16|e4m3|e5m2
                            k and v type (default --dtype); float files are quantized as
                            value / scale
  --k-scale X, --v-scale X  fp8 per-tensor scales: real value = stored value * scale
  --device cpu|cuda|cuda:N  (default cpu) the CPU reference backend, or the GPU: q and KV
                            in f16/bf16, head dims 64, 128, 256 or 512 (decode on CUDA
                            cores; prefill also 192/128).
                            One query token per request on paged KV runs the decode kernel
                            (KV also e4m3/e5m2; no custom mask); everything else the
                            prefill kernel (paged or ragged KV, any query lengths, causal,
                            window, custom mask, soft-cap, ALiBi, sigmoid; no RoPE)
  --fp64                    CPU only: accumulate in float64 (the test oracle's mode)
  --threads N               CPU threads (default: all)
  --out-dir DIR             created when missing
)";

// The inputs, owning every buffer the problem's views point into.
struct Inputs {
  HostTensor q, k, v;
  HostTensor qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  HostTensor custom_mask, mask_indptr, rope_offsets, alibi_slopes;
};

NpyArray read_input(const Args& args, const char* option) {
  return read_npy(args.required(option));
}

// float32/float16 data converted to `dtype`, divided by `scale` first (fp8 quantization).
HostTensor convert(const NpyArray& array, const char* option, DType dtype, float scale = 1.0f) {
  const HostTensor& in = array.tensor;
  FLARE_CHECK(in.dtype() == DType::kF32 || in.dtype() == DType::kF16, ErrorCode::kInvalidArgument,
              "--", option, ": expected float32 or float16 data ('<f4' or '<f2'), got '",
              array.descr, "'");
  HostTensor out(dtype, in.shape());
  for (int64_t i = 0; i < in.numel(); ++i) out.set(i, in.get(i) / scale);
  return out;
}

// A 1-D int32 or int64 array as int32 (NumPy's default integer type is int64).
HostTensor index_array(const Args& args, const char* option) {
  const std::string path = args.required(option);
  NpyArray array = read_npy(path);
  const HostTensor& in = array.tensor;
  FLARE_CHECK(in.shape().size() == 1, ErrorCode::kInvalidArgument, "--", option, " ", path,
              ": expected a 1-D array, got shape ", in.view().shape_str());
  if (in.dtype() == DType::kI32) return std::move(array.tensor);
  FLARE_CHECK(in.dtype() == DType::kI64, ErrorCode::kInvalidArgument, "--", option, " ", path,
              ": expected int32 or int64 data ('<i4' or '<i8'), got '", array.descr, "'");
  HostTensor out(DType::kI32, {in.numel()});  // 1-D
  for (int64_t i = 0; i < in.numel(); ++i) {
    const int64_t value = in.data<int64_t>()[i];
    FLARE_CHECK(value >= std::numeric_limits<int32_t>::min() &&
                    value <= std::numeric_limits<int32_t>::max(),
                ErrorCode::kInvalidArgument, "--", option, " ", path, ": element ", i, " = ", value,
                " does not fit int32");
    out.data<int32_t>()[i] = static_cast<int32_t>(value);
  }
  return out;
}

// K or V in the KV dtype: raw fp8 bits from a '|u1' file, else float data quantized.
HostTensor kv_tensor(const Args& args, const char* option, DType kv_dtype, float scale) {
  NpyArray array = read_input(args, option);
  if (array.tensor.dtype() != DType::kU8) return convert(array, option, kv_dtype, scale);
  FLARE_CHECK(is_fp8(kv_dtype) && array.descr == "|u1", ErrorCode::kInvalidArgument, "--", option,
              ": uint8 data holds raw fp8 bits and needs --kv-dtype e4m3 or e5m2");
  HostTensor out(kv_dtype, array.tensor.shape());
  std::copy_n(array.tensor.data<uint8_t>(), out.numel(), out.data<uint8_t>());
  return out;
}

void validate_kv(const PagedKV& kv) { validate_paged_kv(kv); }
void validate_kv(const RaggedKV& kv) { validate_ragged_kv(kv); }

// Packs a bool mask (one byte per bit, all requests concatenated) into the library's little
// bit order, one byte-aligned run per request: inputs.custom_mask and its byte offsets,
// inputs.mask_indptr.
void pack_bool_mask(const HostTensor& bools, const TensorView& qo_indptr, const KVCache& kv,
                    Inputs& inputs) {
  // The lengths come from the index arrays: validate them before reading through them.
  validate_indptr(qo_indptr, "qo_indptr");
  std::visit([](const auto& cache) { validate_kv(cache); }, kv);
  const int64_t batch = ragged_batch(qo_indptr);
  FLARE_CHECK(std::visit([](const auto& cache) { return cache.batch(); }, kv) == batch,
              ErrorCode::kInvalidArgument, "kv_indptr must have batch + 1 = ", batch + 1,
              " entries like qo_indptr");
  std::vector<int32_t> offsets{0};
  int64_t total_bits = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t bits = ragged_length(qo_indptr, i) * kv_length(kv, i);
    total_bits += bits;
    const int64_t end = offsets.back() + (bits + 7) / 8;
    FLARE_CHECK(end <= std::numeric_limits<int32_t>::max(), ErrorCode::kInvalidArgument,
                "--custom-mask: the packed mask exceeds 2^31 - 1 bytes");
    offsets.push_back(static_cast<int32_t>(end));
  }
  FLARE_CHECK(bools.numel() == total_bits, ErrorCode::kInvalidArgument,
              "--custom-mask: a bool mask needs sum(q_len * kv_len) = ", total_bits,
              " elements, got ", bools.numel());
  inputs.custom_mask = HostTensor(DType::kU8, {std::max<int64_t>(offsets.back(), 1)});
  std::fill_n(inputs.custom_mask.data<uint8_t>(), inputs.custom_mask.numel(), uint8_t{0});
  int64_t source = 0;
  for (int64_t i = 0; i < batch; ++i) {
    uint8_t* bytes = inputs.custom_mask.data<uint8_t>() + offsets[i];
    const int64_t bits = ragged_length(qo_indptr, i) * kv_length(kv, i);
    for (int64_t b = 0; b < bits; ++b, ++source) {
      if (bools.data<uint8_t>()[source]) bytes[b / 8] |= static_cast<uint8_t>(1u << (b % 8));
    }
  }
  inputs.mask_indptr = HostTensor(DType::kI32, {batch + 1});
  std::copy(offsets.begin(), offsets.end(), inputs.mask_indptr.data<int32_t>());
}

KVCache read_kv(const Args& args, DType kv_dtype, float k_scale, float v_scale, Inputs& inputs) {
  inputs.k = kv_tensor(args, "k", kv_dtype, k_scale);
  inputs.v = kv_tensor(args, "v", kv_dtype, v_scale);
  inputs.kv_indptr = index_array(args, "kv-indptr");
  if (!args.has("kv-indices")) {
    for (const HostTensor* t : {&inputs.k, &inputs.v}) {
      FLARE_CHECK(t->shape().size() == 3, ErrorCode::kInvalidArgument, "--",
                  t == &inputs.k ? "k" : "v",
                  ": ragged KV (no --kv-indices) is [total_kv, H_kv, D], got shape ",
                  t->view().shape_str());
    }
    return RaggedKV{inputs.k.view(), inputs.v.view(), inputs.kv_indptr.view()};
  }
  inputs.kv_indices = index_array(args, "kv-indices");
  inputs.kv_last_page_len = index_array(args, "kv-last-page-len");
  const KVLayout layout = parse_kv_layout(args.choice_or("layout", {"NHD", "HND"}, "NHD").c_str());
  for (const HostTensor* t : {&inputs.k, &inputs.v}) {
    FLARE_CHECK(t->shape().size() == 4, ErrorCode::kInvalidArgument, "--",
                t == &inputs.k ? "k" : "v", ": paged KV is ",
                layout == KVLayout::kNHD ? "NHD [pages, page_size, H_kv, D]"
                                         : "HND [pages, H_kv, page_size, D]",
                ", got shape ", t->view().shape_str());
  }
  PagedKV kv =
      PagedKV::from_separate(inputs.k.view(), inputs.v.view(), layout, inputs.kv_indptr.view(),
                             inputs.kv_indices.view(), inputs.kv_last_page_len.view());
  const int64_t page_size = args.integer_or("page-size", kv.page_size(), 1);
  FLARE_CHECK(page_size == kv.page_size(), ErrorCode::kInvalidArgument, "--page-size ", page_size,
              " does not match the page size ", kv.page_size(), " of --k (shape ",
              inputs.k.view().shape_str(), ", ", kv_layout_name(layout), ")");
  return kv;
}

AttentionParams read_params(const Args& args, const KVCache& kv, Inputs& inputs) {
  AttentionParams params;
  params.sm_scale = static_cast<float>(args.number_or("sm-scale", 0.0));
  params.logits_soft_cap = static_cast<float>(args.number_or("soft-cap", 0.0));
  params.window_left = static_cast<int32_t>(args.integer_or("window-left", -1, 0));
  params.use_softmax = !args.has("sigmoid");
  params.sigmoid_bias = static_cast<float>(args.number_or("sigmoid-bias", 0.0));

  if (args.has("causal")) params.mask = MaskMode::kCausal;
  if (args.has("custom-mask")) {
    params.mask = MaskMode::kCustom;
    NpyArray mask = read_input(args, "custom-mask");
    if (mask.descr == "|b1") {
      FLARE_CHECK(!args.has("mask-indptr"), ErrorCode::kInvalidArgument,
                  "--mask-indptr goes with a packed ('|u1') --custom-mask; a bool ('|b1') mask "
                  "is packed by flare");
      pack_bool_mask(mask.tensor, inputs.qo_indptr.view(), kv, inputs);
    } else {
      FLARE_CHECK(mask.descr == "|u1", ErrorCode::kInvalidArgument,
                  "--custom-mask: expected packed bits ('|u1') or a bool mask ('|b1'), got '",
                  mask.descr, "'");
      FLARE_CHECK(args.has("mask-indptr"), ErrorCode::kInvalidArgument,
                  "a packed ('|u1') --custom-mask needs --mask-indptr");
      inputs.custom_mask = std::move(mask.tensor);
      inputs.mask_indptr = index_array(args, "mask-indptr");
    }
    params.custom_mask = inputs.custom_mask.view();
    params.mask_indptr = inputs.mask_indptr.view();
  }
  if (args.has("alibi")) {
    params.pos_encoding = PosEncoding::kAlibi;
    if (args.has("alibi-slopes")) {
      NpyArray slopes = read_input(args, "alibi-slopes");
      inputs.alibi_slopes = convert(slopes, "alibi-slopes", DType::kF32);
      params.alibi_slopes = inputs.alibi_slopes.view();
    }
  }
  if (args.has("rope")) {
    params.pos_encoding = PosEncoding::kRopeLlama;
    params.rope_theta = static_cast<float>(args.number_or("rope-theta", params.rope_theta));
    params.rope_scale = static_cast<float>(args.number_or("rope-scale", params.rope_scale));
    if (args.has("rope-offsets")) {
      inputs.rope_offsets = index_array(args, "rope-offsets");
      params.rope_offsets = inputs.rope_offsets.view();
    }
  }
  return params;
}

// Option combinations that cannot work, reported before any file is read.
void check_option_combinations(const Args& args) {
  for (const char* option : {"q", "k", "v", "qo-indptr", "kv-indptr", "out-dir"}) {
    args.required(option);
  }
  const std::pair<const char*, const char*> needs[] = {
      {"kv-last-page-len", "kv-indices"},
      {"kv-indices", "kv-last-page-len"},
      {"page-size", "kv-indices"},
      {"layout", "kv-indices"},
      {"mask-indptr", "custom-mask"},
      {"alibi-slopes", "alibi"},
      {"rope-theta", "rope"},
      {"rope-scale", "rope"},
      {"rope-offsets", "rope"},
      {"sigmoid-bias", "sigmoid"},
  };
  for (const auto& [option, needed] : needs) {
    if (args.has(option) && !args.has(needed)) {
      args.usage_error("--" + std::string(option) + " needs --" + needed);
    }
  }
  const std::pair<const char*, const char*> exclusive[] = {{"causal", "custom-mask"},
                                                           {"alibi", "rope"}};
  for (const auto& [a, b] : exclusive) {
    if (args.has(a) && args.has(b)) {
      args.usage_error("--" + std::string(a) + " and --" + b + " exclude each other");
    }
  }
  for (const char* positive :
       {"sm-scale", "soft-cap", "rope-theta", "rope-scale", "k-scale", "v-scale"}) {
    if (args.has(positive) && !(args.number_or(positive, 0.0) > 0)) {
      args.usage_error("--" + std::string(positive) + " must be > 0");
    }
  }
}

// BatchDecode runs batches of one query token per request on a paged cache (fp8 KV included)
// unless they need what only the prefill has (custom masks, head_dim_qk != head_dim_vo);
// BatchPrefill runs everything else.
bool runs_as_gpu_decode(const AttentionProblem& problem) {
  const auto* paged = std::get_if<PagedKV>(&problem.kv);
  if (paged == nullptr || problem.params.mask == MaskMode::kCustom ||
      paged->head_dim_qk() != paged->head_dim_vo()) {
    return false;
  }
  const int64_t batch = ragged_batch(problem.qo_indptr);
  for (int64_t i = 0; i < batch; ++i) {
    if (ragged_length(problem.qo_indptr, i) != 1) return false;
  }
  return true;
}

// Plans and runs once on the GPU; o and lse come back as float32.
template <class Gpu>
void run_gpu(Gpu& gpu, const AttentionOutput& out) {
  gpu.plan();
  gpu.run();
  const HostTensor o = gpu.o();
  for (int64_t i = 0; i < o.numel(); ++i) store_float(out.o.data, DType::kF32, i, o.get(i));
  if (out.lse) {
    const HostTensor lse = gpu.lse();
    std::copy_n(lse.data<float>(), lse.numel(), out.lse->ptr<float>());
  }
}

// The CPU reference, or the GPU: BatchDecode for decode batches, BatchPrefill for the rest.
void run_on_device(const Device& device, const AttentionProblem& problem,
                   const AttentionOutput& out, const ReferenceOptions& options) {
  if (device.is_cpu()) {
    reference_attention(problem, out, options);
    return;
  }
  validate_attention(problem, out);  // the GPU does not read index arrays back to check them
  if (runs_as_gpu_decode(problem)) {
    GpuDecode gpu(problem, device.index);
    run_gpu(gpu, out);
  } else {
    GpuPrefill gpu(problem, device.index);
    run_gpu(gpu, out);
  }
}

}  // namespace

int run_attention(int argc, char** argv) {
  const Args args("attention", argc, argv,
                  {{"q", true},
                   {"k", true},
                   {"v", true},
                   {"qo-indptr", true},
                   {"kv-indptr", true},
                   {"kv-indices", true},
                   {"kv-last-page-len", true},
                   {"page-size", true},
                   {"layout", true},
                   {"causal", false},
                   {"window-left", true},
                   {"custom-mask", true},
                   {"mask-indptr", true},
                   {"sm-scale", true},
                   {"soft-cap", true},
                   {"alibi", false},
                   {"alibi-slopes", true},
                   {"rope", false},
                   {"rope-theta", true},
                   {"rope-scale", true},
                   {"rope-offsets", true},
                   {"sigmoid", false},
                   {"sigmoid-bias", true},
                   {"dtype", true},
                   {"kv-dtype", true},
                   {"k-scale", true},
                   {"v-scale", true},
                   {"device", true},
                   {"fp64", false},
                   {"threads", true},
                   {"out-dir", true}});
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  check_option_combinations(args);
  const Device device = args.device_or("device", "cpu");
  if (device.is_cuda() && args.has("fp64")) args.usage_error("--fp64 is a mode of the CPU backend");
  const std::optional<std::string> kv_dtype_name = args.text("kv-dtype");
  if ((args.has("k-scale") || args.has("v-scale")) &&
      !(kv_dtype_name == "e4m3" || kv_dtype_name == "e5m2")) {
    args.usage_error("--k-scale and --v-scale apply to an fp8 --kv-dtype (e4m3, e5m2)");
  }
  const ReferenceOptions options{args.has("fp64") ? Accumulation::kF64 : Accumulation::kF32,
                                 static_cast<int>(args.integer_or("threads", 0, 0))};

  Inputs inputs;
  const NpyArray q = read_input(args, "q");
  const std::string dtype_text = args.choice_or("dtype", {"f32", "f16", "bf16"},
                                                q.tensor.dtype() == DType::kF16 ? "f16" : "f32");
  const DType dtype = parse_dtype(dtype_text);
  const DType kv_dtype =
      parse_dtype(args.choice_or("kv-dtype", {"f32", "f16", "bf16", "e4m3", "e5m2"}, dtype_text));
  inputs.q = convert(q, "q", dtype);
  FLARE_CHECK(inputs.q.shape().size() == 3, ErrorCode::kInvalidArgument,
              "--q: expected [total_q, H_qo, D_qk], got shape ", inputs.q.view().shape_str());
  inputs.qo_indptr = index_array(args, "qo-indptr");
  const float k_scale = static_cast<float>(args.number_or("k-scale", 1.0));
  const float v_scale = static_cast<float>(args.number_or("v-scale", 1.0));
  const KVCache kv = read_kv(args, kv_dtype, k_scale, v_scale, inputs);
  AttentionParams params = read_params(args, kv, inputs);
  params.k_scale = k_scale;
  params.v_scale = v_scale;
  const AttentionProblem problem{inputs.q.view(), inputs.qo_indptr.view(), kv, params};

  const int64_t total_q = inputs.q.shape()[0];
  const int64_t heads_qo = inputs.q.shape()[1];
  const int64_t head_dim_vo = inputs.v.shape().back();
  HostTensor o(DType::kF32, {total_q, heads_qo, head_dim_vo});
  HostTensor lse(DType::kF32, {total_q, heads_qo});
  const AttentionOutput out{o.view(),
                            params.use_softmax ? std::optional(lse.view()) : std::nullopt};

  const auto start = std::chrono::steady_clock::now();
  run_on_device(device, problem, out, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::filesystem::path out_dir = args.required("out-dir");
  std::error_code mkdir_error;
  std::filesystem::create_directories(out_dir, mkdir_error);
  FLARE_CHECK(!mkdir_error, ErrorCode::kIoError, "cannot create --out-dir ", out_dir.string(), ": ",
              mkdir_error.message());
  write_npy((out_dir / "o.npy").string(), o.view());
  if (params.use_softmax) {
    write_npy((out_dir / "lse.npy").string(), lse.view());
  } else {
    std::filesystem::remove(out_dir / "lse.npy", mkdir_error);  // no stale lse beside this o
  }
  std::printf("wrote %s/o.npy %s%s (%s, %lld requests, %.3f s)\n", out_dir.string().c_str(),
              o.view().shape_str().c_str(),
              params.use_softmax ? (" and lse.npy " + lse.view().shape_str()).c_str() : "",
              device.str().c_str(), static_cast<long long>(ragged_batch(problem.qo_indptr)),
              seconds);
  return 0;
}

}  // namespace flare::cli
