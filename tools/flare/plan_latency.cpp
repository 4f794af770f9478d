// The planner latency benchmark: plan() runs every generation step, before the kernels of the
// step can launch, so its latency adds to every step. Each timed run plans one step of a batch
// whose KV lengths grow by one token per step (as in decoding); the table gives the median and
// the 10th/90th percentiles over many runs on one thread, pinned to one core where possible.
#include "tools/flare/plan_latency.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flare/plan/plan.h"
#include "tools/flare/args.h"

#ifdef __linux__
#include <sched.h>
#endif

namespace {

constexpr const char* kHelp =
    "usage: flare plan-latency [--runs N] [--num-sms N] [--lengths uniform|zipf]\n"
    "                          [--batches 1,64,256,1024] [--kinds decode|prefill|both]\n\n"
    "Times plan() (the load-balanced scheduler) on one core for decode (q_len 1) and causal\n"
    "prefill (q_len = kv_len) batches: 32 query heads, 8 KV heads, head dim 128, page size 16,\n"
    "KV lengths of mean 1024 (uniform in [1, 2047], or Zipf-skewed), --num-sms CTAs\n"
    "(default 132, an H100). Each run plans one decoding step: KV lengths grow by one token\n"
    "per run, for 64 runs, then start over.\n"
    "Prints median, 10th and 90th percentile microseconds over --runs runs (default 2000)\n"
    "and the plan's size (work items, partial slots).\n";

constexpr int kQoHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr int kMeanLength = 1024;
constexpr int kWarmupRuns = 50;
constexpr int kDecodeSteps = 64;

std::vector<int32_t> kv_lengths(int64_t batch, bool zipf, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<int32_t> lengths(static_cast<size_t>(batch));
  if (!zipf) {
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

struct Timing {
  double p10_us;
  double median_us;
  double p90_us;
  size_t work_items;
  int32_t partial_slots;
};

Timing time_plan(bool prefill, int64_t batch, bool zipf, int runs, int num_sms) {
  const std::vector<int32_t> initial_kv = kv_lengths(batch, zipf, static_cast<uint64_t>(batch));
  std::vector<int32_t> kv = initial_kv;
  std::vector<int32_t> qo(kv.size(), 1);
  flare::PlanProblem problem;
  problem.num_qo_heads = kQoHeads;
  problem.num_kv_heads = kKvHeads;
  problem.head_dim_qk = kHeadDim;
  problem.head_dim_vo = kHeadDim;
  problem.page_size = kPageSize;
  problem.causal = true;
  problem.qo_len = qo;
  problem.kv_len = kv;
  const flare::DeviceSpec device{num_sms, 1};

  std::vector<double> micros;
  micros.reserve(static_cast<size_t>(runs));
  Timing timing{};
  for (int run = -kWarmupRuns; run < runs; ++run) {
    // The next decoding step; every kDecodeSteps runs the batch starts over, so that the
    // lengths keep their distribution however many runs are timed.
    for (size_t i = 0; i < kv.size(); ++i)
      kv[i] = initial_kv[i] + (run + kWarmupRuns) % kDecodeSteps;
    if (prefill) std::copy(kv.begin(), kv.end(), qo.begin());
    const auto start = std::chrono::steady_clock::now();
    const flare::Plan result = flare::plan(problem, device);
    const auto stop = std::chrono::steady_clock::now();
    if (run < 0) continue;
    micros.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    timing.work_items = result.work_items.size();
    timing.partial_slots = result.num_partial_slots;
  }
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double fraction) {
    return micros[static_cast<size_t>(fraction * static_cast<double>(micros.size() - 1))];
  };
  timing.p10_us = at(0.1);
  timing.median_us = at(0.5);
  timing.p90_us = at(0.9);
  return timing;
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

}  // namespace

int run_plan_latency(int argc, char** argv) {
  const flare::cli::Args args(
      "plan-latency", argc, argv,
      {{"runs", true}, {"num-sms", true}, {"lengths", true}, {"batches", true}, {"kinds", true}});
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const int runs = static_cast<int>(args.integer_or("runs", 2000, 1));
  const int num_sms = static_cast<int>(args.integer_or("num-sms", 132, 1));
  const bool zipf = args.choice_or("lengths", {"uniform", "zipf"}, "uniform") == "zipf";
  const std::vector<int64_t> batches = parse_batches(args);
  const std::string kinds = args.choice_or("kinds", {"decode", "prefill", "both"}, "both");
  pin_to_one_core();

  std::printf(
      "plan() latency, one core: H_qo %d, H_kv %d, D %d, page %d, %d CTAs, %s KV "
      "lengths (mean %d), %d runs\n",
      kQoHeads, kKvHeads, kHeadDim, kPageSize, num_sms, zipf ? "zipf" : "uniform", kMeanLength,
      runs);
  std::printf("%-8s %6s %12s %8s %10s %10s %10s\n", "kind", "batch", "work items", "slots",
              "p10 us", "median us", "p90 us");
  for (const bool prefill : {false, true}) {
    if (kinds != "both" && (kinds == "prefill") != prefill) continue;
    for (const int64_t batch : batches) {
      const Timing t = time_plan(prefill, batch, zipf, runs, num_sms);
      std::printf("%-8s %6lld %12zu %8d %10.2f %10.2f %10.2f\n", prefill ? "prefill" : "decode",
                  static_cast<long long>(batch), t.work_items, t.partial_slots, t.p10_us,
                  t.median_us, t.p90_us);
    }
  }
  return 0;
}
