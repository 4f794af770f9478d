// `flare bench`: times attention on a synthetic serving batch (decode or prefill) on the GPU
// or the CPU backend and reports time, throughput, bandwidth, FLOP rate and the error
// against the float64 reference on a few sampled requests.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "tools/flare/args.h"
#include "tools/flare/bench_check.h"
#include "tools/flare/bench_report.h"
#include "tools/flare/bench_runner.h"
#include "tools/flare/commands.h"
#include "tools/flare/device_tensor.h"
#include "tools/flare/progress.h"
#include "tools/flare/workload.h"

namespace flare::cli {
namespace {

constexpr const char* kHelp = R"(usage: flare bench [options]

Times batch attention on a synthetic serving workload: a paged KV cache filled with random
data, pages handed out in random order (or a ragged one), per-request lengths from a
distribution. Prints a table (or one JSON object with --json): median time per call,
throughput (decode: requests/s; prefill: query tokens/s), KV bytes read per second, FLOP/s
(4 * head_dim * H_qo per visible (query, key) pair: causal and window masks counted exactly),
and the largest absolute error against the float64 reference on up to 4 sampled requests
(their last 256 query tokens).

workload
  --mode decode|prefill     one query token per request, or --qo-len of them (causal)
                            (default decode)
  --batch N                 requests (default 32 for decode, 4 for prefill)
  --kv-len N                mean KV tokens per request, including the new ones (default 1024)
  --qo-len N                mean query tokens per request, prefill only (default 256)
  --dist constant|uniform|zipf
                            length distribution: all equal to the mean; uniform in
                            [1, 2*mean-1]; Zipf-skewed (many short, a few very long requests)
                            (default constant)
  --heads-qo N              query heads (default 32)
  --heads-kv N              KV heads; must divide --heads-qo (default 8)
  --head-dim N              head dimension, a multiple of 8 up to 512 (default 128)
  --kv paged|ragged         KV cache kind; ragged is for --mode prefill (default paged)
  --page-size N             tokens per KV page, paged only (default 16)
  --variant default|softcap|window|alibi
                            plain softmax; logits soft-cap 50; sliding window of a quarter
                            of --kv-len; ALiBi with the default slopes (default default)
  --dtype f32|f16|bf16      q and o (default bf16)
  --kv-dtype f32|f16|bf16|e4m3|e5m2
                            k and v pages; fp8 pages use a per-tensor scale (default --dtype)
  --seed N                  random lengths, page order and data (default 0)

running
  --device cpu|cuda|cuda:N  default: cuda when a CUDA device is usable and runs the
                            workload (else cpu, with a note). The CPU backend runs the
                            planner's work queues with the reference kernels, one planner
                            "SM" per thread. The GPU runs decode through BatchDecode (f16/bf16
                            q, KV also e4m3/e5m2) and prefill through BatchPrefill (paged or
                            ragged, q and KV in one of f16/bf16), head dim 64/128/256; each
                            timed sample there averages back-to-back calls over at least
                            1 ms (CUDA events).
  --threads N               CPU threads (default: all hardware threads)
  --iters N                 timed samples after one warm-up sample (default: as many as
                            fit in about 2 seconds, at least 3, at most 200)
  --json                    print one JSON object instead of the table

On a terminal, a line on stderr shows the phase running (workload, warm-up, timed samples,
reference check); it is erased before the result is printed.
)";

constexpr double kAutoItersSeconds = 2.0;  // --iters default: calls that fit in this time
constexpr int kMinAutoIters = 3;
constexpr int kMaxAutoIters = 200;
constexpr int kCheckedRequests = 4;

WorkloadSpec parse_spec(const Args& args) {
  WorkloadSpec spec;
  spec.mode = parse_bench_mode(args.choice_or("mode", {"decode", "prefill"}, "decode"));
  const bool decode = spec.mode == BenchMode::kDecode;
  if (decode && args.has("qo-len")) args.usage_error("--qo-len applies to --mode prefill only");
  spec.kv = parse_bench_kv(args.choice_or("kv", {"paged", "ragged"}, "paged"));
  if (decode && spec.kv == BenchKV::kRagged) {
    args.usage_error("--kv ragged applies to --mode prefill only (decode reads a paged cache)");
  }
  if (spec.kv == BenchKV::kRagged && args.has("page-size")) {
    args.usage_error("--page-size applies to --kv paged only");
  }
  spec.batch = args.integer_or("batch", decode ? 32 : 4, 1);
  spec.kv_len = args.integer_or("kv-len", 1024, 1);
  spec.qo_len = decode ? 1 : args.integer_or("qo-len", 256, 1);
  spec.dist =
      parse_length_dist(args.choice_or("dist", {"constant", "uniform", "zipf"}, "constant"));
  spec.heads_qo = args.integer_or("heads-qo", 32, 1);
  spec.heads_kv = args.integer_or("heads-kv", 8, 1);
  spec.head_dim = args.integer_or("head-dim", 128, 1);
  spec.page_size = spec.kv == BenchKV::kRagged ? 1 : args.integer_or("page-size", 16, 1);
  spec.variant = parse_bench_variant(
      args.choice_or("variant", {"default", "softcap", "window", "alibi"}, "default"));
  const std::string dtype = args.choice_or("dtype", {"f32", "f16", "bf16"}, "bf16");
  spec.dtype = parse_dtype(dtype);
  spec.kv_dtype =
      parse_dtype(args.choice_or("kv-dtype", {"f32", "f16", "bf16", "e4m3", "e5m2"}, dtype));
  spec.seed = static_cast<uint64_t>(args.integer_or("seed", 0, 0));
  return spec;
}

// Without --device: the GPU; the CPU backend, with a note saying why, when no CUDA device is
// usable or the CUDA backend does not run the workload yet.
BenchRunner default_runner(const Workload& work, int threads, Progress& progress) {
  if (!cuda::available()) {
    progress.note("no usable CUDA device (" + cuda::unavailable_reason() +
                  "); benchmarking the CPU backend");
    return make_cpu_runner(work, threads);
  }
  try {
    return make_cuda_runner(work, 0);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::kUnsupported) throw;
    progress.note(std::string(error.what()) + "; benchmarking the CPU backend instead");
  }
  return make_cpu_runner(work, threads);
}

}  // namespace

int run_bench(int argc, char** argv) {
  const Args args("bench", argc, argv,
                  {{"mode", true},
                   {"batch", true},
                   {"kv-len", true},
                   {"qo-len", true},
                   {"dist", true},
                   {"heads-qo", true},
                   {"heads-kv", true},
                   {"head-dim", true},
                   {"kv", true},
                   {"page-size", true},
                   {"variant", true},
                   {"dtype", true},
                   {"kv-dtype", true},
                   {"device", true},
                   {"threads", true},
                   {"iters", true},
                   {"seed", true},
                   {"json", false}});
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const WorkloadSpec spec = parse_spec(args);
  const int threads = static_cast<int>(args.integer_or("threads", 0, 0));
  const int requested_iters = static_cast<int>(args.integer_or("iters", 0, 1));
  // An explicit --device is obeyed, or fails: a missing GPU is said before the workload is
  // built or checked.
  const bool device_given = args.has("device");
  const Device device = args.device_or("device", "cpu");
  if (device_given && device.is_cuda()) use_cuda_device(device.index);

  Progress progress("bench");
  progress.step("generating the workload...");
  const Workload work = make_workload(spec);
  // The warm-up covers planning and, on the GPU, compiling and loading the kernels.
  progress.step("warm-up (plan, first call)...");
  BenchRunner runner = !device_given      ? default_runner(work, threads, progress)
                       : device.is_cuda() ? make_cuda_runner(work, device.index)
                                          : make_cpu_runner(work, threads);

  // One untimed sample first: first-touch page faults, caches, module loading. Its wall time
  // (a GPU sample spans many calls) sizes the run.
  const auto warmup_start = std::chrono::steady_clock::now();
  runner.run();
  const double sample_seconds = std::max(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - warmup_start).count(), 1e-9);
  const int iters = requested_iters > 0
                        ? requested_iters
                        : std::clamp(static_cast<int>(kAutoItersSeconds / sample_seconds),
                                     kMinAutoIters, kMaxAutoIters);
  BenchResult result;
  for (int i = 0; i < iters; ++i) {
    progress.bar("timing", i, iters);
    result.call_seconds.push_back(runner.run());
  }
  progress.step("checking " + std::to_string(std::min<int64_t>(spec.batch, kCheckedRequests)) +
                " requests against the float64 reference...");
  const HostTensor o = runner.output();
  result.check = check_sampled_requests(work, o.view(), kCheckedRequests);
  progress.finish();

  result.spec = spec;
  result.device = runner.device;
  result.total_q = work.total_q();
  result.total_kv = work.total_kv();
  result.kv_len_min = *std::min_element(work.kv_lens.begin(), work.kv_lens.end());
  result.kv_len_max = *std::max_element(work.kv_lens.begin(), work.kv_lens.end());
  result.kv_tokens_read = work.kv_tokens_read();
  result.visible_pairs = work.visible_pairs();
  result.plan_seconds = runner.plan_seconds;
  result.num_ctas = runner.num_ctas;
  result.num_work_items = runner.num_work_items;
  if (args.has("json")) {
    print_json(stdout, result);
  } else {
    print_table(stdout, result);
  }
  return 0;
}

}  // namespace flare::cli
