// How parameterized tests show their parameters: GoogleTest printers for the library's enums
// ("bfloat16", "HND" instead of byte dumps) and a case name for architecture parameters.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "flare/core/dtype.h"
#include "flare/core/lse_base.h"
#include "flare/format/paged_kv.h"

namespace flare {

// Found by argument-dependent lookup from GoogleTest's printers (also inside tuples).
inline void PrintTo(DType dtype, std::ostream* os) { *os << dtype_name(dtype); }
inline void PrintTo(KVLayout layout, std::ostream* os) { *os << kv_layout_name(layout); }
inline void PrintTo(LseBase base, std::ostream* os) {
  *os << (base == LseBase::kBase2 ? "base 2" : "natural");
}

namespace testing {

// Names each case of a test parameterized by architecture after it: ".../sm_90a", not ".../1".
struct ArchName {
  template <class Param>
  std::string operator()(const ::testing::TestParamInfo<Param>& info) const {
    return std::string(info.param);
  }
};

}  // namespace testing
}  // namespace flare
