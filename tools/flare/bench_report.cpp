// Table and JSON output of `flare bench` (see bench_report.h).
#include "tools/flare/bench_report.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "flare/core/dtype.h"

namespace flare::cli {
namespace {

// "1.23 G" style: three significant digits and an SI prefix.
std::string si(double value, const char* unit) {
  static constexpr const char* kPrefixes[] = {"", "k", "M", "G", "T", "P"};
  int prefix = 0;
  while (std::fabs(value) >= 1000.0 && prefix < 5) {
    value /= 1000.0;
    ++prefix;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%.3g %s%s", value, kPrefixes[prefix], unit);
  return text;
}

std::string duration(double seconds) {
  char text[64];
  if (seconds >= 1.0) {
    std::snprintf(text, sizeof(text), "%.3g s", seconds);
  } else if (seconds >= 1e-3) {
    std::snprintf(text, sizeof(text), "%.3g ms", seconds * 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.3g us", seconds * 1e6);
  }
  return text;
}

void row(std::FILE* out, const char* label, const std::string& value) {
  std::fprintf(out, "  %-14s %s\n", label, value.c_str());
}

std::string format(const char* pattern, auto... values) {
  char text[256];
  std::snprintf(text, sizeof(text), pattern, values...);
  return text;
}

// JSON numbers cannot be NaN or infinite; those become null.
std::string json_number(double value) {
  return std::isfinite(value) ? format("%.6g", value) : "null";
}

}  // namespace

double BenchResult::median_seconds() const {
  if (call_seconds.empty()) return 0;
  std::vector<double> sorted = call_seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  return sorted.size() % 2 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
}

double BenchResult::min_seconds() const {
  return call_seconds.empty() ? 0 : *std::min_element(call_seconds.begin(), call_seconds.end());
}

double BenchResult::kv_bytes_per_call() const {
  return static_cast<double>(kv_tokens_read) * static_cast<double>(spec.heads_kv) * 2.0 *
         static_cast<double>(spec.head_dim) * static_cast<double>(dtype_bytes(spec.kv_dtype));
}

double BenchResult::flop_per_call() const {
  return 2.0 * static_cast<double>(visible_pairs) * static_cast<double>(spec.heads_qo) * 2.0 *
         static_cast<double>(spec.head_dim);
}

void print_table(std::FILE* out, const BenchResult& r) {
  const WorkloadSpec& s = r.spec;
  const double t = r.median_seconds();
  const bool decode = s.mode == BenchMode::kDecode;
  std::fprintf(out, "flare bench: %s on %s\n", std::string(name_of(s.mode)).c_str(),
               r.device.c_str());
  row(out, "requests",
      format(
          "%lld, kv_len mean %.0f (%s, %lld..%lld)%s", static_cast<long long>(s.batch),
          static_cast<double>(r.total_kv) / static_cast<double>(s.batch),
          std::string(name_of(s.dist)).c_str(), static_cast<long long>(r.kv_len_min),
          static_cast<long long>(r.kv_len_max),
          decode ? "" : format(", %lld query tokens", static_cast<long long>(r.total_q)).c_str()));
  row(out, "shape",
      format(
          "heads %lld qo / %lld kv, head_dim %lld, %s", static_cast<long long>(s.heads_qo),
          static_cast<long long>(s.heads_kv), static_cast<long long>(s.head_dim),
          s.kv == BenchKV::kRagged
              ? "ragged KV"
              : format("paged KV, page_size %lld", static_cast<long long>(s.page_size)).c_str()));
  row(out, "types",
      format("q/o %s, kv %s, variant %s", std::string(dtype_name(s.dtype)).c_str(),
             std::string(dtype_name(s.kv_dtype)).c_str(), std::string(name_of(s.variant)).c_str()));
  row(out, "plan",
      format("%s, %d CTAs, %lld work items", duration(r.plan_seconds).c_str(), r.num_ctas,
             static_cast<long long>(r.num_work_items)));
  row(out, "time / call",
      format("%s median (min %s, %zu calls)", duration(t).c_str(),
             duration(r.min_seconds()).c_str(), r.call_seconds.size()));
  row(out, "throughput",
      decode ? si(static_cast<double>(s.batch) / t, "requests/s")
             : si(static_cast<double>(r.total_q) / t, "query tokens/s"));
  row(out, "KV read",
      format("%s (%s per call)", si(r.kv_bytes_per_call() / t, "B/s").c_str(),
             si(r.kv_bytes_per_call(), "B").c_str()));
  row(out, "compute",
      format("%s (%s per call)", si(r.flop_per_call() / t, "FLOP/s").c_str(),
             si(r.flop_per_call(), "FLOP").c_str()));
  row(out, "max |error|",
      format("%.3g vs float64 reference (%lld of %lld requests)", r.check.max_abs_error,
             static_cast<long long>(r.check.requests_checked), static_cast<long long>(s.batch)));
}

void print_json(std::FILE* out, const BenchResult& r) {
  const WorkloadSpec& s = r.spec;
  const double t = r.median_seconds();
  const auto text = [](std::string_view value) {
    std::string quoted = "\"";
    for (char c : value) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return quoted + "\"";
  };
  const auto integer = [](int64_t value) { return std::to_string(value); };
  const std::pair<const char*, std::string> fields[] = {
      {"mode", text(name_of(s.mode))},
      {"device", text(r.device)},
      {"batch", integer(s.batch)},
      {"dist", text(name_of(s.dist))},
      {"kv_len_mean", json_number(static_cast<double>(r.total_kv) / static_cast<double>(s.batch))},
      {"kv_len_min", integer(r.kv_len_min)},
      {"kv_len_max", integer(r.kv_len_max)},
      {"total_q", integer(r.total_q)},
      {"total_kv", integer(r.total_kv)},
      {"heads_qo", integer(s.heads_qo)},
      {"heads_kv", integer(s.heads_kv)},
      {"head_dim", integer(s.head_dim)},
      {"kv", text(name_of(s.kv))},
      {"page_size", integer(s.page_size)},
      {"variant", text(name_of(s.variant))},
      {"dtype", text(dtype_name(s.dtype))},
      {"kv_dtype", text(dtype_name(s.kv_dtype))},
      {"seed", integer(static_cast<int64_t>(s.seed))},
      {"iters", integer(static_cast<int64_t>(r.call_seconds.size()))},
      {"plan_us", json_number(r.plan_seconds * 1e6)},
      {"num_ctas", integer(r.num_ctas)},
      {"num_work_items", integer(r.num_work_items)},
      {"time_ms_median", json_number(t * 1e3)},
      {"time_ms_min", json_number(r.min_seconds() * 1e3)},
      {"requests_per_s", json_number(static_cast<double>(s.batch) / t)},
      {"tokens_per_s", json_number(static_cast<double>(r.total_q) / t)},
      {"kv_bytes_per_s", json_number(r.kv_bytes_per_call() / t)},
      {"flop_per_s", json_number(r.flop_per_call() / t)},
      {"max_abs_error", json_number(r.check.max_abs_error)},
      {"checked_requests", integer(r.check.requests_checked)},
  };
  std::string json = "{";
  for (const auto& [key, value] : fields) {
    json += (json.size() > 1 ? ", \"" : "\"") + std::string(key) + "\": " + value;
  }
  std::fprintf(out, "%s}\n", json.c_str());
}

}  // namespace flare::cli
