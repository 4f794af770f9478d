// Timing helpers of the host-time experiments (plan_nvfp4_host.cpp, cascade_host_table5.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace host_timing {

using Clock = std::chrono::steady_clock;

inline double us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace host_timing
