// The GPU SpMM launchers' shared pieces (src/sparse/spmm_launch.h).
#include "src/sparse/spmm_launch.h"

#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "flare/jit/module.h"

namespace flare::sparse::spmm_launch {

int64_t chunk_count(int64_t rows, int64_t nnz, int64_t chunk_items) {
  return (rows + nnz + chunk_items - 1) / chunk_items;
}

WorkspaceLayout workspace_layout(int64_t rows, int64_t nnz, const SpmmSchedule& schedule) {
  const auto chunks = static_cast<size_t>(chunk_count(rows, nnz, schedule.chunk_items));
  WorkspaceLayout layout;
  layout.head = chunks * static_cast<size_t>(schedule.feature_tile) * 4;
  layout.carry_row = 2 * layout.head;
  layout.head_row = layout.carry_row + chunks * 4;
  layout.bytes = layout.head_row + chunks * 4;
  return layout;
}

void launch_csr(SpmmCsrParams& p, void* workspace, const SpmmSchedule& schedule,
                cuda::Function chunks, cuda::Function carries, cuda::Stream stream) {
  const WorkspaceLayout layout = workspace_layout(p.rows, p.nnz, schedule);
  p.chunks = chunk_count(p.rows, p.nnz, schedule.chunk_items);
  p.chunk = static_cast<int32_t>(schedule.chunk_items);
  char* scratch = static_cast<char*>(workspace);
  p.carry = reinterpret_cast<float*>(scratch);
  p.head = reinterpret_cast<float*>(scratch + layout.head);
  p.carry_row = reinterpret_cast<int32_t*>(scratch + layout.carry_row);
  p.head_row = reinterpret_cast<int32_t*>(scratch + layout.head_row);
  constexpr int64_t kWarpsPerBlock = kSpmmThreads / 32;
  const auto blocks = static_cast<unsigned>((p.chunks + kWarpsPerBlock - 1) / kWarpsPerBlock);
  void* args[] = {&p};
  cuda::launch(chunks, blocks, 1, 1, kSpmmThreads, 1, 1, 0, stream, args);
  cuda::launch(carries, blocks, 1, 1, kSpmmThreads, 1, 1, 0, stream, args);
}

void launch_mapped_csr(const MappedCsr& m, int64_t cols, int64_t y_rows, const TensorView& x_tile,
                       const TensorView& y_tile, int64_t x_stride, int64_t y_stride,
                       bool accumulate, void* workspace, cuda::Function chunks,
                       cuda::Function carries, cuda::Stream stream) {
  SpmmCsrParams c{};
  c.indptr = m.indptr;
  c.indices = m.indices;
  c.values = m.values;
  c.x = x_tile.data;
  c.y = y_tile.data;
  c.rows = m.rows;
  c.cols = cols;
  c.nnz = cols > 0 ? m.nnz : 0;  // without columns no nonzero may read X
  c.x_stride = x_stride;
  c.y_stride = y_stride;
  c.row_ids = m.row_ids;
  c.y_rows = y_rows;
  c.accumulate = accumulate ? 1 : 0;
  const int64_t tile = x_tile.shape[1];
  launch_csr(c, workspace, {tile, spmm_chunk_items(tile)}, chunks, carries, stream);
}

namespace {

struct KeyHash {
  size_t operator()(const KernelKey& k) const {
    size_t h = static_cast<size_t>(k.family);
    for (const int v : {k.features, k.vec, static_cast<int>(k.dtype), k.device})
      h = h * 1000003u + static_cast<size_t>(v);
    return h;
  }
};

}  // namespace

const std::vector<cuda::Function>& cached_kernels(const KernelKey& key,
                                                  jit::KernelSpec (*make_spec)(int, int, DType),
                                                  std::initializer_list<const char*> entries) {
  static std::mutex mutex;
  // Functions stay loaded for the life of the process (flare/jit/module.h), and so do these.
  static std::unordered_map<KernelKey, std::vector<cuda::Function>, KeyHash> table;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto found = table.find(key);
    if (found != table.end()) return found->second;
  }
  // Compiled outside the table's lock (a first compile takes seconds); a concurrent first
  // call of the same key finds the same functions (get_kernel loads a module once).
  const jit::KernelSpec spec = make_spec(key.features, key.vec, key.dtype);
  std::vector<cuda::Function> functions;
  for (const char* entry : entries) functions.push_back(jit::get_kernel(spec, entry, key.device));
  std::lock_guard<std::mutex> lock(mutex);
  return table.try_emplace(key, std::move(functions)).first->second;
}

}  // namespace flare::sparse::spmm_launch
