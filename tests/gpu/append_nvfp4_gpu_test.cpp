// The NVFP4 quantizing append on the GPU against the CPU path (bit for bit, every code and
// scale byte of the cache), by page table and by flat slot, f16 / bf16, NHD / HND, values from
// e4m3's subnormal scales to its saturation; an out-of-range slot and a bad global scale are
// recorded (check_append_paged_kv) and write nothing. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "flare/api/append_paged_kv_nvfp4.h"
#include "flare/jit/cuda_driver.h"
#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/random.h"

namespace flare {
namespace {

constexpr uint8_t kSentinel = 0x5A;

// A contiguous host tensor's bytes on device 0, viewed with the host view's shape.
struct OnDevice {
  cuda::DeviceBuffer buffer;
  TensorView view;
  explicit OnDevice(const HostTensor& host)
      : buffer(std::max<size_t>(
            1, static_cast<size_t>(host.view().numel()) * dtype_bytes(host.view().dtype))) {
    view = host.view();
    const size_t bytes = static_cast<size_t>(view.numel()) * dtype_bytes(view.dtype);
    if (bytes > 0) cuda::memcpy_htod(buffer.data(), view.data, bytes);
    view.data = buffer.data();
    view.device = Device::cuda(0);
  }
  void copy_back(const HostTensor& host) const {
    const size_t bytes = static_cast<size_t>(view.numel()) * dtype_bytes(view.dtype);
    if (bytes > 0) cuda::memcpy_dtoh(host.view().data, buffer.data(), bytes);
  }
};

struct Cache {
  HostTensor k_codes, v_codes, k_scales, v_scales;
  KVLayout layout;
  Cache(KVLayout l, int64_t pages, int64_t page_size, int64_t heads, int64_t dk, int64_t dv)
      : k_codes(DType::kU8, shape(l, pages, page_size, heads, dk / 2)),
        v_codes(DType::kU8, shape(l, pages, page_size, heads, dv / 2)),
        k_scales(DType::kE4M3, shape(l, pages, page_size, heads, dk / 16)),
        v_scales(DType::kE4M3, shape(l, pages, page_size, heads, dv / 16)),
        layout(l) {
    for (const HostTensor* t : {&k_codes, &v_codes, &k_scales, &v_scales}) {
      std::memset(t->view().data, kSentinel, static_cast<size_t>(t->view().numel()));
    }
  }
  static std::vector<int64_t> shape(KVLayout l, int64_t p, int64_t s, int64_t h, int64_t d) {
    return l == KVLayout::kNHD ? std::vector<int64_t>{p, s, h, d}
                               : std::vector<int64_t>{p, h, s, d};
  }
  Nvfp4Pages host() const {
    return {k_codes.view(), v_codes.view(), k_scales.view(), v_scales.view(), layout};
  }
};

void expect_same_bytes(const HostTensor& a, const HostTensor& b, const char* what) {
  const auto* x = static_cast<const uint8_t*>(a.view().data);
  const auto* y = static_cast<const uint8_t*>(b.view().data);
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < a.view().numel(); ++i) {
    if (x[i] != y[i] && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0) << what << ": first differing byte " << first << " GPU "
                           << (first >= 0 ? int(x[first]) : 0) << " CPU "
                           << (first >= 0 ? int(y[first]) : 0);
}

// Copies the device cache (k codes, v codes, k scales, v scales) into `gpu` and compares every
// byte with `cpu`.
void expect_same_cache(const std::array<const OnDevice*, 4>& device, const Cache& gpu,
                       const Cache& cpu) {
  const HostTensor* gpu_parts[] = {&gpu.k_codes, &gpu.v_codes, &gpu.k_scales, &gpu.v_scales};
  const HostTensor* cpu_parts[] = {&cpu.k_codes, &cpu.v_codes, &cpu.k_scales, &cpu.v_scales};
  const char* names[] = {"k codes", "v codes", "k scales", "v scales"};
  for (int i = 0; i < 4; ++i) {
    device[i]->copy_back(*gpu_parts[i]);
    expect_same_bytes(*gpu_parts[i], *cpu_parts[i], names[i]);
  }
}

HostTensor scalar(float x) {
  HostTensor t(DType::kF32, {1});
  *static_cast<float*>(t.view().data) = x;
  return t;
}

// Rows with magnitudes from 1e-6 (scales in e4m3's subnormals or 0) to 3e3 (saturating).
HostTensor wide_range_rows(DType dtype, int64_t tokens, int64_t heads, int64_t dim, uint64_t seed) {
  HostTensor rows = testing::random_tensor(DType::kF32, {tokens, heads, dim}, seed);
  HostTensor out(dtype, {tokens, heads, dim});
  const float magnitudes[] = {1e-6f, 3e-3f, 1.0f, 40.0f, 3e3f};
  for (int64_t i = 0; i < rows.view().numel(); ++i) {
    const float x = static_cast<const float*>(rows.view().data)[i] *
                    magnitudes[(i / 16) % 5];  // one magnitude a block
    store_float(out.view().data, dtype, i, x);
  }
  return out;
}

class Nvfp4AppendGpu : public ::testing::TestWithParam<std::tuple<KVLayout, DType>> {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
    cuda::set_device(0);
  }
};

TEST_P(Nvfp4AppendGpu, PageTableMatchesTheCpuBitForBit) {
  const auto [layout, dtype] = GetParam();
  constexpr int64_t kPages = 40, kPageSize = 16, kHeads = 4, kDk = 128, kDv = 64;
  Cache gpu(layout, kPages, kPageSize, kHeads, kDk, kDv),
      cpu(layout, kPages, kPageSize, kHeads, kDk, kDv);
  // Three requests over shuffled pages; 45 tokens appended at scattered positions, 3 padding.
  HostTensor indptr = testing::int32_tensor({0, 3, 4, 9});
  HostTensor indices = testing::int32_tensor({7, 30, 2, 11, 39, 0, 21, 5, 16});
  HostTensor last = testing::int32_tensor({16, 16, 16});
  // Token t: request t % 3 (every 16th from the 6th is padding) at position t / 3 (+ 30 in the
  // third request): distinct slots, since a slot written twice would race on the GPU.
  std::vector<int32_t> batch, positions;
  for (int t = 0; t < 48; ++t) {
    batch.push_back(t % 16 == 5 ? -1 : t % 3);
    positions.push_back(t / 3 + (t % 3 == 2 ? 30 : 0));
  }
  HostTensor batch_t = testing::int32_tensor(batch), positions_t = testing::int32_tensor(positions);
  HostTensor key = wide_range_rows(dtype, 48, kHeads, kDk, 1);
  HostTensor value = wide_range_rows(dtype, 48, kHeads, kDv, 2);
  HostTensor k_global = scalar(0.37f), v_global = scalar(1.0f);
  const BlockSparseIndex host_table{kPageSize, indptr.view(), indices.view(), last.view()};
  append_paged_kv_nvfp4({key.view(), value.view(), batch_t.view(), positions_t.view()}, cpu.host(),
                        host_table, {k_global.view(), v_global.view()});

  const OnDevice kc(gpu.k_codes), vc(gpu.v_codes), ks(gpu.k_scales), vs(gpu.v_scales);
  const OnDevice dkey(key), dvalue(value), dbatch(batch_t), dpos(positions_t), dindptr(indptr),
      dindices(indices), dlast(last), dkg(k_global), dvg(v_global);
  const BlockSparseIndex table{kPageSize, dindptr.view, dindices.view, dlast.view};
  append_paged_kv_nvfp4({dkey.view, dvalue.view, dbatch.view, dpos.view},
                        {kc.view, vc.view, ks.view, vs.view, layout}, table, {dkg.view, dvg.view});
  check_append_paged_kv(0);
  expect_same_cache({&kc, &vc, &ks, &vs}, gpu, cpu);
}

TEST_P(Nvfp4AppendGpu, SlotsMatchTheCpuAndBadInputWritesNothing) {
  const auto [layout, dtype] = GetParam();
  constexpr int64_t kPages = 5, kPageSize = 3, kHeads = 2, kD = 64;
  for (const DType slot_type : {DType::kI32, DType::kI64}) {
    Cache gpu(layout, kPages, kPageSize, kHeads, kD, kD),
        cpu(layout, kPages, kPageSize, kHeads, kD, kD);
    HostTensor key = wide_range_rows(dtype, 7, kHeads, kD, 3);  // 6 slots + an extra row
    HostTensor value = wide_range_rows(dtype, 7, kHeads, kD, 4);
    const std::vector<int64_t> slots = {14, -1, 0, 5, 9, -7};
    HostTensor slot_t(slot_type, {6});
    for (int i = 0; i < 6; ++i) store_float(slot_t.view().data, slot_type, i, float(slots[i]));
    HostTensor one = scalar(1.0f), half = scalar(0.5f);
    append_paged_kv_nvfp4_by_slot({key.view(), value.view(), slot_t.view()}, cpu.host(),
                                  {one.view(), half.view()});
    const OnDevice kc(gpu.k_codes), vc(gpu.v_codes), ks(gpu.k_scales), vs(gpu.v_scales);
    const OnDevice dkey(key), dvalue(value), dslots(slot_t), dk(one), dv(half);
    const Nvfp4Pages pages{kc.view, vc.view, ks.view, vs.view, layout};
    append_paged_kv_nvfp4_by_slot({dkey.view, dvalue.view, dslots.view}, pages, {dk.view, dv.view});
    check_append_paged_kv(0);
    // Bad input afterwards: a slot past the cache (recorded, skipped) and a zero scale (recorded,
    // nothing written): the cache stays as the good append left it.
    HostTensor bad_slots = testing::int32_tensor({-1, int32_t{kPages * kPageSize}});
    const OnDevice dbad(bad_slots);
    HostTensor zero = scalar(0.0f);
    const OnDevice dzero(zero);
    append_paged_kv_nvfp4_by_slot({dkey.view, dvalue.view, dslots.view}, pages,
                                  {dzero.view, dv.view});
    EXPECT_FLARE_ERROR(check_append_paged_kv(0), ErrorCode::kIndexOutOfRange, "k_scale = 0");
    append_paged_kv_nvfp4_by_slot({dkey.view, dvalue.view, dbad.view}, pages, {dk.view, dv.view});
    EXPECT_FLARE_ERROR(check_append_paged_kv(0), ErrorCode::kIndexOutOfRange,
                       "slot_mapping[1] = 15");
    expect_same_cache({&kc, &vc, &ks, &vs}, gpu, cpu);
  }
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndDtypes, Nvfp4AppendGpu,
                         ::testing::Combine(::testing::Values(KVLayout::kNHD, KVLayout::kHND),
                                            ::testing::Values(DType::kF16, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<KVLayout, DType>>& info) {
                           return std::string(kv_layout_name(std::get<0>(info.param))) + "_" +
                                  (std::get<1>(info.param) == DType::kF16 ? "f16" : "bf16");
                         });

}  // namespace
}  // namespace flare
