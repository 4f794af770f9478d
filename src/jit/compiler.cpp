// NVRTC compilation of a KernelSpec: the translation unit, the option list, the compile itself
// with the embedded kernels/*.cuh as headers, and the resource report of each entry.
#include "flare/jit/compiler.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "flare/core/error.h"
#include "flare/core/identifier.h"
#include "flare/jit/embedded_sources.h"
#include "flare/jit/log.h"
#include "src/jit/compile_steps.h"
#include "src/jit/cubin_elf.h"
#include "src/jit/nvrtc_api.h"
#include "src/jit/ptxas_report.h"

namespace flare::jit {
namespace {

std::string display_label(const KernelSpec& spec) {
  if (!spec.label.empty()) return spec.label;
  return spec.entry.empty() ? spec.family_header : spec.entry;
}

// Every embedded kernels/*.cuh under its file name and under "kernels/<name>" (the spelling the
// host uses), so device code can include either. NVRTC treats the two names as two files, so
// #pragma once alone would define everything twice when both spellings meet in one unit; one
// include guard per source, shared by both names, makes them a single file again. The #line
// keeps NVRTC's error locations in the header's own numbering.
struct HeaderTable {
  std::vector<std::string> names;
  std::vector<std::string> texts;
  std::vector<const char*> name_pointers;
  std::vector<const char*> text_pointers;
};

std::string guarded_text(const EmbeddedSource& source) {
  std::string guard = "FLARE_EMBEDDED_";
  for (const char* c = source.name; *c != '\0'; ++c) {
    guard += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
  }
  return "#ifndef " + guard + "\n#define " + guard + "\n#line 1 \"" + source.name + "\"\n" +
         source.text + "\n#endif\n";
}

const HeaderTable& embedded_headers() {
  static const HeaderTable table = [] {
    HeaderTable t;
    for (const EmbeddedSource& source : embedded_sources()) {
      const std::string text = guarded_text(source);
      for (const std::string& name :
           {std::string(source.name), std::string("kernels/") + source.name}) {
        t.names.push_back(name);
        t.texts.push_back(text);
      }
    }
    for (size_t i = 0; i < t.names.size(); ++i) {
      t.name_pointers.push_back(t.names[i].c_str());
      t.text_pointers.push_back(t.texts[i].c_str());
    }
    return t;
  }();
  return table;
}

void check_family_header(const KernelSpec& spec) {
  const HeaderTable& headers = embedded_headers();
  if (std::find(headers.names.begin(), headers.names.end(), spec.family_header) !=
      headers.names.end()) {
    return;
  }
  std::string known;
  for (const EmbeddedSource& source : embedded_sources()) {
    known += (known.empty() ? "" : ", ") + std::string(source.name);
  }
  fail(ErrorCode::kInvalidArgument, "KernelSpec.family_header '", spec.family_header,
       "' is not an embedded kernel header (embedded: ", known, ")");
}

std::string format_seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", seconds);
  return text;
}

std::string summarize(const std::vector<ResourceUsage>& usage) {
  int registers = 0, spill_bytes = 0, local_bytes = 0;
  bool spills_known = true;
  for (const ResourceUsage& u : usage) {
    registers = std::max(registers, u.registers);
    local_bytes = std::max(local_bytes, u.local_bytes);
    if (u.spill_bytes == ResourceUsage::kUnknownSpills) {
      spills_known = false;
    } else {
      spill_bytes += u.spill_bytes;
    }
  }
  std::string text = std::to_string(registers) + " registers, ";
  if (!spills_known) {
    text += "spills unknown";
  } else {
    text += spill_bytes == 0 ? "0 spills" : std::to_string(spill_bytes) + " bytes spilled";
  }
  if (local_bytes > 0) text += ", " + std::to_string(local_bytes) + " bytes local memory";
  return text;
}

class ProgramGuard {
 public:
  ProgramGuard(const nvrtc::Api& api, nvrtc::Program program) : api_(api), program_(program) {}
  ~ProgramGuard() { api_.nvrtcDestroyProgram(&program_); }
  ProgramGuard(const ProgramGuard&) = delete;
  ProgramGuard& operator=(const ProgramGuard&) = delete;

 private:
  const nvrtc::Api& api_;
  nvrtc::Program program_;
};

std::string program_log(const nvrtc::Api& api, nvrtc::Program program) {
  size_t bytes = 0;
  if (api.nvrtcGetProgramLogSize(program, &bytes) != nvrtc::kSuccess || bytes == 0) return "";
  std::string log(bytes, '\0');
  if (api.nvrtcGetProgramLog(program, log.data()) != nvrtc::kSuccess) return "";
  log.resize(std::strlen(log.c_str()));  // the size counts the terminating NUL
  return log;
}

}  // namespace

std::string KernelSpec::translation_unit() const {
  FLARE_CHECK(!family_header.empty() && family_header.find_first_of("\"\n") == std::string::npos,
              ErrorCode::kInvalidArgument,
              "KernelSpec.family_header must be a header file name, got '", family_header, "'");
  std::string unit;
  for (const auto& [name, value] : defines) {
    FLARE_CHECK(is_c_identifier(name), ErrorCode::kInvalidArgument,
                "KernelSpec.defines: name must be a C identifier, got '", name, "'");
    FLARE_CHECK(value.find('\n') == std::string::npos, ErrorCode::kInvalidArgument,
                "KernelSpec.defines: value of ", name, " must be one line, got '", value, "'");
    unit += "#define " + name + " " + value + "\n";
  }
  if (!variant_source.empty()) {
    // NVRTC then reports errors in the variant at their own line numbers.
    unit += "#line 1 \"variant_source\"\n" + variant_source;
    if (variant_source.back() != '\n') unit += '\n';
  }
  unit += "#include \"" + family_header + "\"\n";
  return unit;
}

std::string arch_for(int cc_major, int cc_minor) {
  FLARE_CHECK(cc_major > 0 && cc_minor >= 0 && cc_minor <= 9, ErrorCode::kInvalidArgument,
              "arch_for: compute capability must be major >= 1 and minor in [0, 9], got ", cc_major,
              ".", cc_minor);
  // Hopper's wgmma and setmaxnreg exist only in the architecture-specific sm_90a target.
  const std::string suffix = (cc_major == 9 && cc_minor == 0) ? "a" : "";
  return "sm_" + std::to_string(cc_major) + std::to_string(cc_minor) + suffix;
}

void check_arch(const std::string& arch) {
  std::string digits = arch.starts_with("sm_") ? arch.substr(3) : "";
  if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) digits.pop_back();
  const bool valid = digits.size() >= 2 && std::all_of(digits.begin(), digits.end(), [](char c) {
                       return std::isdigit(static_cast<unsigned char>(c));
                     });
  FLARE_CHECK(valid, ErrorCode::kInvalidArgument,
              "arch must look like sm_80 or sm_90a (see arch_for), got '", arch, "'");
}

std::vector<std::string> nvrtc_options(const std::string& arch) {
  std::vector<std::string> options = {
      "--gpu-architecture=" + arch,  // a real sm_ target: NVRTC emits a cubin
      "-std=c++17",
      "-default-device",
      // Registers, stack, spills and shared memory per kernel, printed into the program log.
      "--ptxas-options=-v",
      "--ptxas-options=--warn-on-spills",
  };
  // NVRTC 12.9+ caches its PTX and cubins in the driver's compute cache (CUDA_CACHE_PATH,
  // ~/.nv/ComputeCache) whenever it can load libcuda: on GPU machines, never in GPU-less CI. A
  // hit skips ptxas and so the report above; the log then lacks the entries (and is empty for a
  // unit that prints nothing else). flare's own disk cache already spares repeated compiles.
  const nvrtc::Toolkit& toolkit = nvrtc::toolkit();
  if (toolkit.version_major > 12 || (toolkit.version_major == 12 && toolkit.version_minor >= 9)) {
    options.push_back("--no-cache");
  }
  // Source-line information for profilers; off by default because it embeds the PTX text.
  const char* lineinfo = std::getenv("FLARE_JIT_LINEINFO");
  if (lineinfo != nullptr && std::strcmp(lineinfo, "1") == 0) options.push_back("-lineinfo");
  for (const std::string& dir : toolkit.include_dirs) {
    options.push_back("--include-path=" + dir);
  }
  return options;
}

std::vector<std::string> entry_names(const KernelSpec& spec) {
  std::vector<std::string> names;
  size_t begin = 0;
  while (begin <= spec.entry.size()) {
    const size_t end = std::min(spec.entry.find(';', begin), spec.entry.size());
    if (end > begin) names.push_back(spec.entry.substr(begin, end - begin));
    begin = end + 1;
  }
  return names;
}

std::vector<ResourceUsage> resource_usage(const std::string& log, const std::string& cubin,
                                          const std::vector<std::string>& entries,
                                          const std::string& label) {
  const std::vector<CubinKernel> kernels = read_cubin_kernels(cubin);
  const std::vector<ResourceUsage> report = parse_ptxas_report(log);
  std::vector<std::string> names = entries;
  if (names.empty()) {
    for (const CubinKernel& kernel : kernels) names.push_back(kernel.name);
  }
  std::vector<ResourceUsage> usage;
  std::string unreported;
  for (const std::string& name : names) {
    const auto kernel = std::find_if(kernels.begin(), kernels.end(),
                                     [&](const CubinKernel& k) { return k.name == name; });
    if (kernel == kernels.end()) {
      std::string found;
      for (const CubinKernel& k : kernels) found += (found.empty() ? "" : ", ") + k.name;
      fail(ErrorCode::kCompileError, label, ": entry '", name,
           "' is not a kernel of the compiled unit (kernels: ", found.empty() ? "none" : found,
           "); entries must be extern \"C\" __global__ functions");
    }
    ResourceUsage u;
    u.entry = name;
    u.registers = kernel->registers;
    u.local_bytes = kernel->stack_bytes;
    u.max_threads = kernel->max_threads;
    const auto reported = std::find_if(report.begin(), report.end(),
                                       [&](const ResourceUsage& r) { return r.entry == name; });
    if (reported != report.end()) {
      // The two sources agree; the larger wins so a check can only err on the safe side. The
      // report adds what the cubin lacks: spill counts and recursive callees' frames.
      u.registers = std::max(u.registers, reported->registers);
      u.local_bytes = std::max(u.local_bytes, reported->local_bytes);
      u.spill_bytes = reported->spill_bytes;
      u.static_shared_bytes = reported->static_shared_bytes;
    } else {
      u.spill_bytes = ResourceUsage::kUnknownSpills;
      unreported += (unreported.empty() ? "'" : ", '") + name + "'";
    }
    usage.push_back(u);
  }
  if (!unreported.empty()) {
    log_warning(label + ": ptxas's report in NVRTC's log has no entry " + unreported +
                "; using the kernel with registers and local memory from the cubin, spill "
                "counts unknown (log: " +
                std::to_string(log.size()) + " bytes)");
  }
  return usage;
}

CompiledKernel compile(const KernelSpec& spec, const std::string& arch) {
  check_arch(arch);
  const std::string unit = spec.translation_unit();
  check_family_header(spec);
  const std::string label = display_label(spec);
  const nvrtc::Toolkit& toolkit = nvrtc::toolkit();
  FLARE_CHECK(toolkit.api != nullptr, ErrorCode::kUnsupported, "cannot compile ", label, ": ",
              toolkit.unavailable_reason);
  const nvrtc::Api& api = *toolkit.api;

  log_info("compiling " + label + " for " + arch + "...");
  const auto start = std::chrono::steady_clock::now();
  const HeaderTable& headers = embedded_headers();
  nvrtc::Program program = nullptr;
  const nvrtc::Result created = api.nvrtcCreateProgram(
      &program, unit.c_str(), "flare_jit_unit.cu", static_cast<int>(headers.text_pointers.size()),
      headers.text_pointers.data(), headers.name_pointers.data());
  FLARE_CHECK(created == nvrtc::kSuccess, ErrorCode::kCompileError, "nvrtcCreateProgram for ",
              label, " failed: ", api.nvrtcGetErrorString(created));
  const ProgramGuard guard(api, program);

  const std::vector<std::string> options = nvrtc_options(arch);
  std::vector<const char*> option_pointers;
  for (const std::string& option : options) option_pointers.push_back(option.c_str());
  const nvrtc::Result compiled = api.nvrtcCompileProgram(
      program, static_cast<int>(option_pointers.size()), option_pointers.data());

  CompiledKernel result;
  result.log = program_log(api, program);
  FLARE_CHECK(compiled == nvrtc::kSuccess, ErrorCode::kCompileError, "NVRTC failed to compile ",
              label, " for ", arch, " (", api.nvrtcGetErrorString(compiled), "):\n", result.log);
  size_t cubin_bytes = 0;
  FLARE_CHECK(api.nvrtcGetCUBINSize(program, &cubin_bytes) == nvrtc::kSuccess && cubin_bytes > 0,
              ErrorCode::kCompileError, "NVRTC produced no cubin for ", label, " (arch ", arch,
              " must be a real sm_ target)");
  result.cubin.resize(cubin_bytes);
  FLARE_CHECK(api.nvrtcGetCUBIN(program, result.cubin.data()) == nvrtc::kSuccess,
              ErrorCode::kCompileError, "nvrtcGetCUBIN failed for ", label);
  result.usage = resource_usage(result.log, result.cubin, entry_names(spec), label);
  result.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("compiled " + label + " in " + format_seconds(result.compile_seconds) + " s (" +
           summarize(result.usage) + ")");
  return result;
}

}  // namespace flare::jit
