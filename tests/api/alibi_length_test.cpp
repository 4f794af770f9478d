// ALiBi's KV-length bound at plan() (kernels/variant.cuh converts positions to float exactly
// below 2^22 = kAlibiMaxKvLen): the host validation of decode and prefill batches refuses a
// longer request, naming it and the bound, and takes one of exactly that length. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "kernels/decode_params.cuh"
#include "src/api/decode_plan.h"
#include "src/api/prefill_plan.h"

namespace flare {
namespace {

constexpr int32_t kPage = 16;
constexpr int32_t kPagesAtLimit = kAlibiMaxKvLen / kPage;

api_detail::DecodePlanSetup decode_setup(bool alibi) {
  api_detail::DecodePlanSetup setup;
  setup.problem.page_size = kPage;
  setup.max_batch = 4;
  setup.alibi = alibi;
  return setup;
}

// Request 1 holds kPagesAtLimit pages, the last one last_page_len tokens long.
std::string decode_error(bool alibi, int32_t last_page_len) {
  const std::vector<int32_t> indptr{0, 3, 3 + kPagesAtLimit};
  const std::vector<int32_t> last{5, last_page_len};
  api_detail::DecodeHostPlan out;
  try {
    api_detail::validate_decode_batch(decode_setup(alibi), indptr, last, out);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    return e.what();
  }
  EXPECT_EQ(out.kv_len, (std::vector<int32_t>{2 * kPage + 5, (kPagesAtLimit - 1) * kPage +
                                                                 last_page_len}));
  return "";
}

TEST(AlibiLength, DecodeTakesTheBoundAndRefusesOneTokenMore) {
  EXPECT_EQ(decode_error(true, kPage), "");  // 2^22 tokens exactly
  // One more page holds one more token: past the bound.
  const std::vector<int32_t> indptr{0, 3, 4 + kPagesAtLimit};
  const std::vector<int32_t> last{5, 1};
  api_detail::DecodeHostPlan out;
  try {
    api_detail::validate_decode_batch(decode_setup(true), indptr, last, out);
    ADD_FAILURE() << "a request of 2^22 + 1 tokens was accepted under ALiBi";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("request 1 has 4194305 KV tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("ALiBi"), std::string::npos) << what;
    EXPECT_NE(what.find("4194304"), std::string::npos) << what;
  }
  // Without ALiBi the same batch is fine.
  EXPECT_NO_THROW(api_detail::validate_decode_batch(decode_setup(false), indptr, last, out));
}

BatchPrefillConfig prefill_config(PosEncoding encoding) {
  BatchPrefillConfig c;
  c.kv = PrefillKV::kPaged;
  c.page_size = kPage;
  c.max_batch = 4;
  c.max_total_qo = 64;
  c.num_qo_heads = 4;
  c.num_kv_heads = 4;
  c.head_dim_qk = 128;
  c.head_dim_vo = 128;
  c.params.pos_encoding = encoding;
  return c;
}

void validate_prefill(PosEncoding encoding, int32_t extra_pages) {
  const std::vector<int32_t> qo_indptr{0, 7};
  const std::vector<int32_t> kv_indptr{0, kPagesAtLimit + extra_pages};
  const std::vector<int32_t> last{extra_pages > 0 ? 1 : kPage};
  api_detail::PrefillHostPlan out;
  api_detail::validate_prefill_batch(prefill_config(encoding), PrefillTiles{64, 64, false}, {},
                                     qo_indptr, kv_indptr, last, {}, out);
}

TEST(AlibiLength, PrefillTakesTheBoundAndRefusesOneTokenMore) {
  EXPECT_NO_THROW(validate_prefill(PosEncoding::kAlibi, 0));
  EXPECT_NO_THROW(validate_prefill(PosEncoding::kNone, 1));
  try {
    validate_prefill(PosEncoding::kAlibi, 1);
    ADD_FAILURE() << "a request of 2^22 + 1 KV tokens was accepted under ALiBi";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("request 0 has 7 query and 4194305 KV tokens"), std::string::npos)
        << what;
    EXPECT_NE(what.find("ALiBi"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace flare
