// Minimal ELF64 reader for NVIDIA cubins. Attribute records in .nv.info sections are
//   u8 format, u8 attribute, then: format 0x04 (EIFMT_SVAL): u16 size + `size` bytes;
//   any other format: a u16 inline value.
// Kernel-wide attributes (.nv.info) name their function by symbol index, as {u32 symbol, u32
// value}; per-kernel sections are called .nv.info.<kernel>.
#include "src/jit/cubin_elf.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

#include "flare/core/error.h"

namespace flare::jit {
namespace {

constexpr uint32_t kSectionSymtab = 2;
constexpr uint8_t kFormatSized = 0x04;
constexpr uint8_t kAttrMaxThreads = 0x05;
constexpr uint8_t kAttrFrameSize = 0x11;
constexpr uint8_t kAttrMinStackSize = 0x12;
constexpr uint8_t kAttrRegCount = 0x2f;
constexpr size_t kSymbolBytes = 24;
constexpr std::string_view kInfoPrefix = ".nv.info.";

class Bytes {
 public:
  explicit Bytes(std::string_view data) : data_(data) {}

  template <class T>
  T read(uint64_t offset) const {
    FLARE_CHECK(offset <= data_.size() && sizeof(T) <= data_.size() - offset, ErrorCode::kInternal,
                "malformed cubin: read of ", sizeof(T), " bytes at offset ", offset,
                " past its end (", data_.size(), " bytes)");
    T value;
    std::memcpy(&value, data_.data() + offset, sizeof(T));  // cubins are little-endian, as is x86
    return value;
  }

  std::string_view slice(uint64_t offset, uint64_t size) const {
    FLARE_CHECK(offset <= data_.size() && size <= data_.size() - offset, ErrorCode::kInternal,
                "malformed cubin: section [", offset, ", ", offset + size, ") past its end (",
                data_.size(), " bytes)");
    return data_.substr(offset, size);
  }

 private:
  std::string_view data_;
};

struct Section {
  std::string name;
  uint32_t type = 0;
  uint32_t link = 0;
  std::string_view contents;
};

std::string c_string_at(std::string_view table, uint32_t offset) {
  FLARE_CHECK(offset < table.size(), ErrorCode::kInternal, "malformed cubin: string offset ",
              offset, " outside its table of ", table.size(), " bytes");
  const std::string_view rest = table.substr(offset);
  return std::string(rest.substr(0, rest.find('\0')));
}

std::vector<Section> read_sections(const Bytes& image) {
  const auto section_offset = image.read<uint64_t>(0x28);
  const auto entry_size = image.read<uint16_t>(0x3a);
  const auto count = image.read<uint16_t>(0x3c);
  const auto names_index = image.read<uint16_t>(0x3e);
  FLARE_CHECK(entry_size >= 0x40 && names_index < count, ErrorCode::kInternal,
              "malformed cubin: section header size ", entry_size, ", name table ", names_index,
              " of ", count);
  std::vector<Section> sections(count);
  std::vector<uint32_t> name_offsets(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t header = section_offset + uint64_t{i} * entry_size;
    name_offsets[i] = image.read<uint32_t>(header);
    sections[i].type = image.read<uint32_t>(header + 0x04);
    sections[i].link = image.read<uint32_t>(header + 0x28);
    const auto offset = image.read<uint64_t>(header + 0x18);
    const auto size = image.read<uint64_t>(header + 0x20);
    constexpr uint32_t kNoBits = 8;  // .nv.shared.*: a size, no file contents
    if (sections[i].type != kNoBits) sections[i].contents = image.slice(offset, size);
  }
  const std::string_view names = sections[names_index].contents;
  for (uint32_t i = 0; i < count; ++i) sections[i].name = c_string_at(names, name_offsets[i]);
  return sections;
}

// Calls visit(attribute, payload) for every record of an .nv.info section.
template <class Visit>
void for_each_attribute(std::string_view info, Visit visit) {
  const Bytes bytes(info);
  uint64_t at = 0;
  while (at + 4 <= info.size()) {
    const auto format = bytes.read<uint8_t>(at);
    const auto attribute = bytes.read<uint8_t>(at + 1);
    if (format == kFormatSized) {
      const auto size = bytes.read<uint16_t>(at + 2);
      visit(attribute, bytes.slice(at + 4, size));
      at += 4 + size;
    } else {
      visit(attribute, info.substr(at + 2, 2));
      at += 4;
    }
  }
}

// Symbol index -> name, from the image's symbol table.
std::map<uint32_t, std::string> symbol_names(const std::vector<Section>& sections) {
  std::map<uint32_t, std::string> names;
  for (const Section& symtab : sections) {
    if (symtab.type != kSectionSymtab) continue;
    FLARE_CHECK(symtab.link < sections.size(), ErrorCode::kInternal,
                "malformed cubin: symbol table links to section ", symtab.link);
    const std::string_view strings = sections[symtab.link].contents;
    const Bytes symbols(symtab.contents);
    for (uint32_t i = 0; (i + 1) * kSymbolBytes <= symtab.contents.size(); ++i) {
      const auto name_offset = symbols.read<uint32_t>(i * kSymbolBytes);
      if (name_offset != 0) names[i] = c_string_at(strings, name_offset);
    }
  }
  return names;
}

}  // namespace

bool is_elf64(std::string_view bytes) {
  return bytes.size() >= 0x40 &&
         bytes.substr(0, 4) ==
             "\x7f"
             "ELF" &&
         bytes[4] == 2 && bytes[5] == 1;
}

std::vector<CubinKernel> read_cubin_kernels(std::string_view cubin) {
  FLARE_CHECK(is_elf64(cubin), ErrorCode::kInternal, "malformed cubin: not a 64-bit ELF image (",
              cubin.size(), " bytes)");
  const Bytes image(cubin);
  const std::vector<Section> sections = read_sections(image);

  std::vector<CubinKernel> kernels;
  std::map<std::string, size_t> kernel_index;
  for (const Section& section : sections) {
    if (!section.name.starts_with(kInfoPrefix)) continue;
    CubinKernel kernel;
    kernel.name = section.name.substr(kInfoPrefix.size());
    for_each_attribute(section.contents, [&](uint8_t attribute, std::string_view payload) {
      if (attribute != kAttrMaxThreads || payload.size() != 12) return;
      const Bytes dims(payload);
      kernel.max_threads = static_cast<int>(dims.read<uint32_t>(0) * dims.read<uint32_t>(4) *
                                            dims.read<uint32_t>(8));
    });
    kernel_index[kernel.name] = kernels.size();
    kernels.push_back(kernel);
  }

  const std::map<uint32_t, std::string> symbols = symbol_names(sections);
  for (const Section& section : sections) {
    if (section.name != ".nv.info") continue;
    for_each_attribute(section.contents, [&](uint8_t attribute, std::string_view payload) {
      if (payload.size() != 8) return;
      if (attribute != kAttrRegCount && attribute != kAttrFrameSize &&
          attribute != kAttrMinStackSize) {
        return;
      }
      const Bytes record(payload);
      const auto symbol = symbols.find(record.read<uint32_t>(0));
      if (symbol == symbols.end()) return;
      // A callee's own frame is skipped: its kernel's minimum stack size counts it.
      const auto kernel = kernel_index.find(symbol->second);
      if (kernel == kernel_index.end()) return;
      CubinKernel& k = kernels[kernel->second];
      const int value = static_cast<int>(record.read<uint32_t>(4));
      if (attribute == kAttrRegCount) {
        k.registers = value;
      } else {
        k.stack_bytes = std::max(k.stack_bytes, value);
      }
    });
  }
  return kernels;
}

}  // namespace flare::jit
