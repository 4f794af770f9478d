// GoogleTest printers for the library's enums: parameterized tests list and report their
// parameters by name ("bfloat16", "HND") instead of as byte dumps.
#pragma once

#include <ostream>

#include "flare/core/dtype.h"
#include "flare/format/paged_kv.h"

namespace flare {

// Found by argument-dependent lookup from GoogleTest's printers (also inside tuples).
inline void PrintTo(DType dtype, std::ostream* os) { *os << dtype_name(dtype); }
inline void PrintTo(KVLayout layout, std::ostream* os) { *os << kv_layout_name(layout); }

}  // namespace flare
