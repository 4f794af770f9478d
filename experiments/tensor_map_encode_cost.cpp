// Host cost of one cuTensorMapEncodeTiled (flare::cuda::encode_tensor_map_3d), the Hopper
// prefill's q_map: run() re-encodes it whenever q's address or shape changes (a serving step's
// new q tensor every call). Median of 2,000 encodes of q's map at alternating addresses.
// Build (GPU machine, after libflare): g++ -O2 -std=c++20 -Iinclude -I.
//   experiments/tensor_map_encode_cost.cpp -Lbuild-ab -lflare -Wl,-rpath,$PWD/build-ab
//   -o build-ab/tensor_map_encode_cost   (one line)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "flare/jit/cuda_driver.h"

int main() {
  flare::cuda::set_device(0);
  const flare::cuda::DeviceBuffer q(size_t{16} * 1024 * 32 * 128 * 2 + 4096);
  flare::cuda::TensorMap map;
  std::vector<double> us;
  for (int i = 0; i < 2000; ++i) {
    const auto* base = static_cast<const unsigned char*>(q.data()) + (i % 2) * 256;
    const auto begin = std::chrono::steady_clock::now();
    flare::cuda::encode_tensor_map_3d(map, true, base, {128, 32, 16 * 1024},
                                      {128 * 2, 32 * 128 * 2}, {64, 4, 32});
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                     .count());
  }
  std::sort(us.begin(), us.end());
  std::printf("cuTensorMapEncodeTiled (3-D, q_map): median %.3f us, p90 %.3f us\n",
              us[us.size() / 2], us[us.size() * 9 / 10]);
}
