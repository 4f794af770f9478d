// Kernel launch and per-function attributes through the driver.
#include "flare/core/error.h"
#include "src/jit/driver_api.h"

namespace flare::cuda {

void launch(Function function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
            unsigned block_y, unsigned block_z, unsigned shared_bytes, Stream stream, void** args,
            bool programmatic) {
  FLARE_CHECK(function != nullptr, ErrorCode::kInvalidArgument,
              "launch: function is null (load it with flare::jit::get_kernel)");
  if (!programmatic) {
    check(driver::api().cuLaunchKernel(function, grid_x, grid_y, grid_z, block_x, block_y, block_z,
                                       shared_bytes, stream, args, nullptr),
          "cuLaunchKernel");
    return;
  }
  driver::LaunchAttribute attribute{};
  attribute.id = driver::kLaunchAttributeProgrammaticStreamSerialization;
  attribute.value.programmatic_stream_serialization_allowed = 1;
  driver::LaunchConfig config{grid_x,  grid_y,       grid_z, block_x,    block_y,
                              block_z, shared_bytes, stream, &attribute, 1};
  check(driver::api().cuLaunchKernelEx(&config, function, args, nullptr),
        "cuLaunchKernelEx(programmatic stream serialization)");
}

void set_max_dynamic_shared(Function function, int bytes) {
  FLARE_CHECK(bytes >= 0, ErrorCode::kInvalidArgument,
              "set_max_dynamic_shared: bytes must be >= 0, got ", bytes);
  check(
      driver::api().cuFuncSetAttribute(function, driver::kFuncAttrMaxDynamicSharedSizeBytes, bytes),
      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

int max_active_blocks_per_sm(Function function, int block_size, size_t dynamic_shared) {
  int blocks = 0;
  check(driver::api().cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, block_size,
                                                                  dynamic_shared),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

namespace {

// cuda.h: CU_TENSOR_MAP_DATA_TYPE_FLOAT16 6, _BFLOAT16 9; INTERLEAVE_NONE 0; SWIZZLE_128B 3;
// L2_PROMOTION_L2_128B 2; FLOAT_OOB_FILL_NONE 0 (zeros).
template <int kRank>
void encode_tiled(TensorMap& map, bool bf16, const void* address, const uint64_t (&dims)[kRank],
                  const uint64_t (&strides)[kRank - 1], const uint32_t (&box)[kRank]) {
  unsigned long long global_dims[kRank];
  unsigned long long global_strides[kRank - 1];
  unsigned box_dims[kRank];
  unsigned element_strides[kRank];
  for (int d = 0; d < kRank; ++d) {
    global_dims[d] = dims[d];
    box_dims[d] = box[d];
    element_strides[d] = 1;
    if (d + 1 < kRank) global_strides[d] = strides[d];
  }
  check(driver::api().cuTensorMapEncodeTiled(&map, bf16 ? 9 : 6, kRank,
                                             const_cast<void*>(address), global_dims,
                                             global_strides, box_dims, element_strides, 0, 3, 2,
                                             0),
        "cuTensorMapEncodeTiled");
}

}  // namespace

void encode_tensor_map_3d(TensorMap& map, bool bf16, const void* address,
                          const uint64_t (&dims)[3], const uint64_t (&strides)[2],
                          const uint32_t (&box)[3]) {
  encode_tiled<3>(map, bf16, address, dims, strides, box);
}

void encode_tensor_map_4d(TensorMap& map, bool bf16, const void* address,
                          const uint64_t (&dims)[4], const uint64_t (&strides)[3],
                          const uint32_t (&box)[4]) {
  encode_tiled<4>(map, bf16, address, dims, strides, box);
}

}  // namespace flare::cuda
