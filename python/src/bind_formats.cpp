// Host conversions between FlashInfer's sparse attention layouts and flare's paged batch
// (include/flare/format/): for the wrappers' plan(), whose array work in numpy cost more than the
// rest of the plan.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "bindings.h"
#include "flare/format/variable_blocks.h"
#include "object_view.h"

namespace flare::python {
namespace {

// The vectors' int32 entries back to back as one bytes object (numpy views it without a list).
nb::bytes joined_bytes(std::initializer_list<const std::vector<int32_t>*> parts) {
  size_t entries = 0;
  for (const std::vector<int32_t>* part : parts) entries += part->size();
  std::vector<int32_t> joined;
  joined.reserve(entries);
  for (const std::vector<int32_t>* part : parts)
    joined.insert(joined.end(), part->begin(), part->end());
  return nb::bytes(reinterpret_cast<const char*>(joined.data()), joined.size() * sizeof(int32_t));
}

}  // namespace

void bind_formats(nb::module_& m) {
  m.def(
      "variable_block_batch",
      [](nb::handle mask, nb::handle row_sizes, nb::handle col_sizes) {
        VariableBlockBatch batch;
        variable_block_batch(object_view(mask, "block_mask_map"),
                             object_view(row_sizes, "block_row_sz"),
                             object_view(col_sizes, "block_col_sz"), batch);
        return nb::make_tuple(joined_bytes({&batch.qo_indptr, &batch.kv_indptr,
                                            &batch.last_page_len, &batch.indices}),
                              batch.qo_len, batch.kv_len);
      },
      nb::arg("block_mask_map"), nb::arg("block_row_sz"), nb::arg("block_col_sz"),
      "FlashInfer's variable block-sparse layout (host arrays: uint8 / bool mask [H, MB, NB], "
      "int32 or int64 sizes [H, MB] and [H, NB]) as one paged batch of page size 1: (the int32 "
      "bytes of qo_indptr [R + 1], kv_indptr [R + 1], last_page_len [R] and indices back to back, "
      "for R = H * MB requests; qo_len; kv_len) (flare/format/variable_blocks.h).");
}

}  // namespace flare::python
