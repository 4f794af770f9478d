// GPU timing of benchmark calls (scripts/bench_cascade.cpp, experiments/bench_small_q_prefill.cpp):
// eager (CUDA events around each of kCalls back-to-back calls, median, as Python's eager_us),
// a CUDA graph of kGraphCalls captured calls (per call, median of 5 replays), and host wall time
// of a call (median of kCalls, the stream synchronized between calls).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"

namespace bench_timing {

using namespace flare;

constexpr int kCalls = 20;
constexpr int kGraphCalls = 10;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Eager: median of events around each of kCalls back-to-back calls (as Python's eager_us).
inline double eager_us(cuda::Stream stream, const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();
  std::vector<cuda::Event> starts, stops;
  for (int i = 0; i < kCalls; ++i) {
    starts.emplace_back(true);
    stops.emplace_back(true);
  }
  for (int i = 0; i < kCalls; ++i) {
    starts[static_cast<size_t>(i)].record(stream);
    call();
    stops[static_cast<size_t>(i)].record(stream);
  }
  stops.back().synchronize();
  std::vector<double> us;
  for (int i = 0; i < kCalls; ++i) {
    us.push_back(1e3 *
                 stops[static_cast<size_t>(i)].elapsed_ms_since(starts[static_cast<size_t>(i)]));
  }
  return median(us);
}

// Graph: one replay of kGraphCalls captured calls, per call.
inline double graph_us(cuda::Stream stream, const std::function<void()>& call) {
  const cuda::Graph graph(stream, [&] {
    for (int i = 0; i < kGraphCalls; ++i) call();
  });
  graph.launch(stream);
  std::vector<double> us;
  for (int r = 0; r < 5; ++r) {
    cuda::Event start(true), stop(true);
    start.record(stream);
    graph.launch(stream);
    stop.record(stream);
    stop.synchronize();
    us.push_back(1e3 * stop.elapsed_ms_since(start) / kGraphCalls);
  }
  return median(us);
}

inline double host_us(const std::function<void()>& call, cuda::Stream stream) {
  std::vector<double> us;
  for (int i = 0; i < kCalls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    cuda::stream_synchronize(stream);
  }
  return median(us);
}

}  // namespace bench_timing
