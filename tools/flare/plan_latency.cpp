// The plan() latency benchmark: plan() runs every generation step, before the kernels of the
// step can launch, so its host time adds to every step. Each timed run is the host work of one
// BatchDecode::plan() or BatchPrefill::plan() (src/api/decode_plan.h, prefill_plan.h: the same
// functions, without a GPU): the index arrays' validation, the planner, and the plan region
// written into a host buffer (what the one async copy then moves). KV lengths grow by one token
// per run (as in decoding); the table gives medians and the 10th/90th percentiles over many
// runs on one thread, pinned to one core where possible.
#include "tools/flare/plan_latency.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "src/api/cascade_plan.h"
#include "src/api/decode_plan.h"
#include "src/api/prefill_plan.h"
#include "tools/flare/args.h"

#ifdef __linux__
#include <sched.h>
#endif

namespace {

constexpr const char* kHelp =
    "usage: flare plan-latency [--runs N] [--num-sms N] [--lengths uniform|zipf|constant]\n"
    "                          [--batches 1,64,256,1024] [--kinds decode|prefill|both|cascade]\n"
    "                          [--decode-loop cuda-core|tensor-core] [--json]\n\n"
    "Times the host work of BatchDecode::plan() and BatchPrefill::plan() on one core, without\n"
    "a GPU: validating the index arrays, planning, and writing the plan region into a host\n"
    "buffer (everything but the one async copy). Decode: q_len 1 (BatchDecode's grid on an\n"
    "H100: 4 CTAs per SM on the CUDA-core loop, 2 x 2 waves on the tensor-core loop); prefill:\n"
    "causal, q_len = kv_len, paged (BatchPrefill's tiles and CTAs per SM on an H100). 32 query\n"
    "heads, 8 KV heads, head dim 128, bf16, page size 16, KV lengths of mean 1024 (uniform in\n"
    "[1, 2047], Zipf-skewed, or all 1024), --num-sms SMs (default 132). Each run plans one\n"
    "decoding step: KV lengths grow by one token per run, for 64 runs, then start over.\n"
    "Prints the plan's size (work items, queue entries, partial slots), the median\n"
    "microseconds of each part (validation, planner, staging) and the 10th percentile, median\n"
    "and 90th percentile of the whole over --runs runs (default 2000); with --json, one flat\n"
    "JSON object per row instead. --kinds cascade times BatchPrefill::plan_cascade()'s host work\n"
    "instead (validation with the tile's pricing, planner with the merge map, staging): decode,\n"
    "one 8192-token prefix shared by the batch (level 0), each request's own KV of the lengths\n"
    "above (level 1).\n";

constexpr int kQoHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr int kMeanLength = 1024;
constexpr int kWarmupRuns = 50;
constexpr int kDecodeSteps = 64;
// An H100 SM's shared memory (228 KiB) and the driver's reservation per CTA: with the kernels'
// shared bytes they give the CTAs per SM the occupancy query returns there (registers allow
// as many for these configurations).
constexpr size_t kSharedBytesPerSm = 228 * 1024;
constexpr size_t kReservedSharedPerCta = 1024;
constexpr int kMaxPrefillCtasPerSm = 2;         // BatchPrefill's cap
constexpr double kH100PeakBytesPerUs = 3.35e6;  // HBM3 of an H100 SXM, as the driver reports it

enum class Lengths { kUniform, kZipf, kConstant };

std::vector<int32_t> kv_lengths(int64_t batch, Lengths kind, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<int32_t> lengths(static_cast<size_t>(batch), kMeanLength);
  if (kind == Lengths::kConstant) return lengths;
  if (kind == Lengths::kUniform) {
    std::uniform_int_distribution<int32_t> uniform(1, 2 * kMeanLength - 1);
    for (int32_t& length : lengths) length = uniform(engine);
    return lengths;
  }
  // length ~ 1 / rank with rank ~ Zipf(1.2) on [1, 32768] (as tests/testing/random.h),
  // rescaled to the mean: a few long requests among many short ones.
  constexpr int kRanks = 1 << 15;
  std::vector<double> weights(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) weights[rank] = std::pow(rank + 1.0, -1.2);
  std::discrete_distribution<int> rank(weights.begin(), weights.end());
  std::vector<double> raw(lengths.size());
  double sum = 0.0;
  for (double& value : raw) {
    value = 1.0 / (rank(engine) + 1);
    sum += value;
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    const double scaled = raw[i] * kMeanLength * static_cast<double>(batch) / sum;
    lengths[i] = std::max(1, static_cast<int32_t>(scaled + 0.5));
  }
  return lengths;
}

void pin_to_one_core() {
#ifdef __linux__
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      sched_setaffinity(0, sizeof(one), &one);
      return;
    }
  }
#endif
}

int ctas_per_sm(size_t shared_bytes, int most) {
  return std::clamp(static_cast<int>(kSharedBytesPerSm / (shared_bytes + kReservedSharedPerCta)), 1,
                    most);
}

// The index arrays the caller of plan() holds for one decoding step: pages per request and the
// last page's length (kv_indptr counts pages), and the query tokens (qo_indptr).
struct StepArrays {
  std::vector<int32_t> qo_indptr;
  std::vector<int32_t> kv_indptr;
  std::vector<int32_t> last_page_len;
};

StepArrays step_arrays(const std::vector<int32_t>& kv_len, bool prefill) {
  StepArrays a;
  a.qo_indptr.assign(1, 0);
  a.kv_indptr.assign(1, 0);
  for (const int32_t length : kv_len) {
    const int32_t pages = (length + kPageSize - 1) / kPageSize;
    a.kv_indptr.push_back(a.kv_indptr.back() + pages);
    a.last_page_len.push_back(length - (pages - 1) * kPageSize);
    a.qo_indptr.push_back(a.qo_indptr.back() + (prefill ? length : 1));
  }
  return a;
}

struct Row {
  size_t work_items = 0;
  int64_t queue_entries = 0;  // work items x the KV heads each covers
  int32_t partial_slots = 0;
  int num_ctas = 0;
  double validate_us = 0;  // medians of the parts
  double planner_us = 0;
  double stage_us = 0;
  double p10_us = 0;  // of the whole
  double median_us = 0;
  double p90_us = 0;

  // The counts of `plan`.
  void count(const flare::Plan& plan) {
    work_items = plan.work_items.size();
    queue_entries = static_cast<int64_t>(work_items) * plan.item_heads;
    partial_slots = plan.num_partial_slots;
    num_ctas = plan.num_ctas;
  }
};

// Times `parts` (validation, planner, staging) of one step per run; returns the medians.
template <typename Parts>
void time_runs(int runs, Parts&& parts, Row& row) {
  std::vector<double> part_us[3];
  std::vector<double> total_us;
  for (int run = -kWarmupRuns; run < runs; ++run) {
    const int step = (run + kWarmupRuns) % kDecodeSteps;
    std::chrono::steady_clock::time_point marks[4];
    parts(step, marks);
    if (run < 0) continue;
    for (int p = 0; p < 3; ++p) {
      part_us[p].push_back(
          std::chrono::duration<double, std::micro>(marks[p + 1] - marks[p]).count());
    }
    total_us.push_back(std::chrono::duration<double, std::micro>(marks[3] - marks[0]).count());
  }
  const auto at = [](std::vector<double>& values, double fraction) {
    std::sort(values.begin(), values.end());
    return values[static_cast<size_t>(fraction * static_cast<double>(values.size() - 1))];
  };
  row.validate_us = at(part_us[0], 0.5);
  row.planner_us = at(part_us[1], 0.5);
  row.stage_us = at(part_us[2], 0.5);
  row.p10_us = at(total_us, 0.1);
  row.median_us = at(total_us, 0.5);
  row.p90_us = at(total_us, 0.9);
}

// The prefill kernel's CTAs an SM at `tiles` (BatchPrefill queries the compiled kernel's
// occupancy once, at its first plan of those tiles).
int prefill_ctas_per_sm(const flare::BatchPrefillConfig& config, const flare::PrefillTiles& tiles) {
  return ctas_per_sm(flare::batch_prefill_kernels(config, tiles).shared_bytes,
                     kMaxPrefillCtasPerSm);
}

std::vector<StepArrays> steps_of(int64_t batch, Lengths lengths, bool prefill) {
  const std::vector<int32_t> initial = kv_lengths(batch, lengths, static_cast<uint64_t>(batch));
  std::vector<StepArrays> steps;
  for (int step = 0; step < kDecodeSteps; ++step) {
    std::vector<int32_t> kv = initial;
    for (int32_t& length : kv) length += step;
    steps.push_back(step_arrays(kv, prefill));
  }
  return steps;
}

Row time_decode(int64_t batch, Lengths lengths, int runs, int num_sms, bool tensor_cores) {
  flare::BatchDecodeConfig config;
  config.max_batch = static_cast<int>(batch);
  config.num_qo_heads = kQoHeads;
  config.num_kv_heads = kKvHeads;
  config.head_dim = kHeadDim;
  config.page_size = kPageSize;
  config.use_tensor_cores = tensor_cores;
  const flare::BatchDecodeKernels kernels =
      flare::batch_decode_kernels(config, flare::kSm90SharedBytesPerBlock);
  const flare::api_detail::DecodePlanSetup setup = flare::api_detail::decode_plan_setup(
      config, num_sms, ctas_per_sm(kernels.decode_shared_bytes, 16));
  const flare::WorkspaceLayout layout = flare::workspace_layout(setup.bounds);
  const std::unique_ptr<std::byte[]> staging(new std::byte[layout.plan_bytes]);
  const std::vector<StepArrays> steps = steps_of(batch, lengths, false);

  flare::api_detail::DecodeHostPlan host;
  Row row;
  time_runs(
      runs,
      [&](int step, std::chrono::steady_clock::time_point* marks) {
        const StepArrays& a = steps[static_cast<size_t>(step)];
        marks[0] = std::chrono::steady_clock::now();
        flare::api_detail::validate_decode_batch(setup, a.kv_indptr, a.last_page_len, host);
        marks[1] = std::chrono::steady_clock::now();
        flare::api_detail::plan_decode(setup, host);
        marks[2] = std::chrono::steady_clock::now();
        flare::api_detail::stage_decode(host, layout, a.kv_indptr, staging.get());
        marks[3] = std::chrono::steady_clock::now();
      },
      row);
  row.count(host.plan);
  return row;
}

// The timed prefills' configuration: the heads, head dim and page size above, paged 16-bit K/V.
flare::BatchPrefillConfig prefill_config(int64_t max_batch, int64_t max_total_qo) {
  flare::BatchPrefillConfig config;
  config.max_batch = static_cast<int>(max_batch);
  config.max_total_qo = static_cast<int>(max_total_qo);
  config.num_qo_heads = kQoHeads;
  config.num_kv_heads = kKvHeads;
  config.head_dim_qk = kHeadDim;
  config.head_dim_vo = kHeadDim;
  config.page_size = kPageSize;
  return config;
}

Row time_prefill(int64_t batch, Lengths lengths, int runs, int num_sms) {
  const std::vector<StepArrays> steps = steps_of(batch, lengths, true);
  // max_total_qo: the longest step's.
  flare::BatchPrefillConfig config = prefill_config(batch, steps.back().qo_indptr.back());
  config.params.mask = flare::MaskMode::kCausal;
  const flare::PrefillDeviceLimits limits = flare::h100_prefill_limits();
  // The largest grid and query tile, as BatchPrefill sizes its workspace.
  const flare::WorkspaceLayout layout = flare::workspace_layout(
      flare::api_detail::prefill_bounds(config, num_sms * kMaxPrefillCtasPerSm, 128));
  // Left uninitialized: the region is sized for query tiles of one row, a plan writes a part.
  const std::unique_ptr<std::byte[]> staging(new std::byte[layout.plan_bytes]);

  flare::api_detail::PrefillHostPlan host;
  int ctas = 0;
  Row row;
  time_runs(
      runs,
      [&](int step, std::chrono::steady_clock::time_point* marks) {
        const StepArrays& a = steps[static_cast<size_t>(step)];
        marks[0] = std::chrono::steady_clock::now();
        flare::api_detail::validate_prefill_batch(config, std::nullopt, limits, a.qo_indptr,
                                                  a.kv_indptr, a.last_page_len, {}, host);
        if (ctas == 0) ctas = prefill_ctas_per_sm(config, host.tiles);
        marks[1] = std::chrono::steady_clock::now();
        flare::api_detail::plan_prefill(config, num_sms, ctas, kH100PeakBytesPerUs, host);
        marks[2] = std::chrono::steady_clock::now();
        flare::api_detail::stage_prefill(host, layout, config.max_batch, a.qo_indptr, a.kv_indptr,
                                         a.last_page_len, staging.get());
        marks[3] = std::chrono::steady_clock::now();
      },
      row);
  row.count(host.plan);
  return row;
}

// BatchPrefill::plan_cascade()'s host work on a decode cascade: level 0 one group of the whole
// batch over a shared prefix of kCascadePrefix tokens, level 1 each request's own pages.
constexpr int kCascadePrefix = 8192;

Row time_cascade(int64_t batch, Lengths lengths, int runs, int num_sms) {
  const std::vector<StepArrays> steps = steps_of(batch, lengths, false);
  // The batch's groups and the prefix's one group; one query token a request.
  flare::BatchPrefillConfig config = prefill_config(batch + 1, batch);
  config.max_levels = 2;
  const flare::PrefillDeviceLimits limits = flare::h100_prefill_limits();
  // Room for every partial slot a cascade can have (BatchPrefill grows to what a plan needs).
  flare::BatchPrefillConfig sized = config;
  sized.use_cuda_graph = true;
  const flare::WorkspaceLayout layout = flare::workspace_layout(
      flare::api_detail::prefill_bounds(sized, num_sms * kMaxPrefillCtasPerSm, 128));
  const std::unique_ptr<std::byte[]> staging(new std::byte[layout.plan_bytes]);
  const int32_t prefix_pages = kCascadePrefix / kPageSize;
  const std::vector<int32_t> qo0{0, static_cast<int32_t>(batch)}, kv0{0, prefix_pages},
      last0{kPageSize};
  std::vector<int32_t> qo1(static_cast<size_t>(batch) + 1);
  for (int64_t r = 0; r <= batch; ++r) qo1[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  // Level 1's page ranges follow level 0's in the one page-id array.
  std::vector<std::vector<int32_t>> kv1(steps.size());
  for (size_t t = 0; t < steps.size(); ++t) {
    for (const int32_t pages : steps[t].kv_indptr) kv1[t].push_back(prefix_pages + pages);
  }

  flare::api_detail::PrefillHostPlan host;
  flare::api_detail::CascadeHostPlan cascade;
  int ctas = 0;
  Row row;
  time_runs(
      runs,
      [&](int step, std::chrono::steady_clock::time_point* marks) {
        const StepArrays& a = steps[static_cast<size_t>(step)];
        const flare::CascadeLevel levels[] = {
            {qo0, kv0, last0}, {qo1, kv1[static_cast<size_t>(step)], a.last_page_len}};
        marks[0] = std::chrono::steady_clock::now();
        flare::api_detail::validate_cascade(config, levels, std::nullopt, limits,
                                            kH100PeakBytesPerUs, cascade, host);
        if (ctas == 0) ctas = prefill_ctas_per_sm(config, host.tiles);
        marks[1] = std::chrono::steady_clock::now();
        flare::api_detail::plan_prefill(config, num_sms, ctas, kH100PeakBytesPerUs, host);
        flare::cascade_merge_map(cascade.batch, host.plan);
        marks[2] = std::chrono::steady_clock::now();
        flare::api_detail::stage_prefill(host, layout, config.max_batch, cascade.batch.qo_begin,
                                         cascade.kv_indptr, cascade.last_page_len, staging.get());
        marks[3] = std::chrono::steady_clock::now();
      },
      row);
  row.count(host.plan);
  return row;
}

std::vector<int64_t> parse_batches(const flare::cli::Args& args) {
  std::vector<int64_t> batches;
  const std::string text = args.text_or("batches", "1,64,256,1024");
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    try {
      size_t used = 0;
      const long long value = std::stoll(item, &used);
      if (used != item.size() || value < 1 || value > (1 << 20)) throw std::invalid_argument(item);
      batches.push_back(value);
    } catch (const std::exception&) {
      args.usage_error("--batches takes batch sizes in [1, 1048576] separated by commas, got '" +
                       text + "'");
    }
    begin = end + 1;
  }
  return batches;
}

void print_json(const char* kind, int64_t batch, const std::string& lengths, int runs,
                const Row& r) {
  std::printf(
      "{\"kind\": \"%s\", \"batch\": %lld, \"lengths\": \"%s\", \"runs\": %d, \"num_ctas\": %d, "
      "\"work_items\": %zu, \"queue_entries\": %lld, \"partial_slots\": %d, "
      "\"validate_us_median\": %.3f, \"planner_us_median\": %.3f, \"stage_us_median\": %.3f, "
      "\"plan_us_p10\": %.3f, \"plan_us_median\": %.3f, \"plan_us_p90\": %.3f}\n",
      kind, static_cast<long long>(batch), lengths.c_str(), runs, r.num_ctas, r.work_items,
      static_cast<long long>(r.queue_entries), r.partial_slots, r.validate_us, r.planner_us,
      r.stage_us, r.p10_us, r.median_us, r.p90_us);
}

}  // namespace

int run_plan_latency(int argc, char** argv) {
  const flare::cli::Args args("plan-latency", argc, argv,
                              {{"runs", true},
                               {"num-sms", true},
                               {"lengths", true},
                               {"batches", true},
                               {"kinds", true},
                               {"decode-loop", true},
                               {"json", false}});
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const int runs = static_cast<int>(args.integer_or("runs", 2000, 1));
  const int num_sms = static_cast<int>(args.integer_or("num-sms", 132, 1));
  const std::string lengths = args.choice_or("lengths", {"uniform", "zipf", "constant"}, "uniform");
  const Lengths lengths_kind = lengths == "zipf"       ? Lengths::kZipf
                               : lengths == "constant" ? Lengths::kConstant
                                                       : Lengths::kUniform;
  const std::vector<int64_t> batches = parse_batches(args);
  const std::string kinds =
      args.choice_or("kinds", {"decode", "prefill", "both", "cascade"}, "both");
  const bool tensor_cores =
      args.choice_or("decode-loop", {"cuda-core", "tensor-core"}, "cuda-core") == "tensor-core";
  const bool json = args.has("json");
  pin_to_one_core();

  if (!json) {
    std::printf(
        "plan() host latency, one core: H_qo %d, H_kv %d, D %d, page %d, %d SMs, %s KV lengths "
        "(mean %d), %d runs; decode on the %s loop\n",
        kQoHeads, kKvHeads, kHeadDim, kPageSize, num_sms, lengths.c_str(), kMeanLength, runs,
        tensor_cores ? "tensor-core" : "CUDA-core");
    std::printf("%-8s %6s %5s %7s %8s %6s | %9s %9s %9s | %9s %9s %9s\n", "kind", "batch", "CTAs",
                "items", "entries", "slots", "valid. us", "planner", "stage", "plan() p10",
                "median", "p90");
  }
  for (const char* kind : {"decode", "prefill", "cascade"}) {
    if (kinds == "both" ? std::string(kind) == "cascade" : kinds != kind) continue;
    for (const int64_t batch : batches) {
      const std::string name = kind;
      const Row r = name == "cascade" ? time_cascade(batch, lengths_kind, runs, num_sms)
                    : name == "prefill"
                        ? time_prefill(batch, lengths_kind, runs, num_sms)
                        : time_decode(batch, lengths_kind, runs, num_sms, tensor_cores);
      if (json) {
        print_json(kind, batch, lengths, runs, r);
        continue;
      }
      std::printf("%-8s %6lld %5d %7zu %8lld %6d | %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f\n", kind,
                  static_cast<long long>(batch), r.num_ctas, r.work_items,
                  static_cast<long long>(r.queue_entries), r.partial_slots, r.validate_us,
                  r.planner_us, r.stage_us, r.p10_us, r.median_us, r.p90_us);
    }
  }
  return 0;
}
