// User-defined variants: validation and the source a kernel compiles (user_variant.h).
#include "flare/variant/user_variant.h"

#include <algorithm>
#include <string>

#include "flare/core/error.h"
#include "flare/core/identifier.h"

namespace flare {
namespace {

// The C type a tensor of `dtype` is read as, or nullptr when variants take no such tensors.
const char* element_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float";
    case DType::kF16:
    case DType::kBF16:
      return "unsigned short";
    case DType::kI32:
      return "int";
    case DType::kI64:
      return "long long";
    case DType::kU8:
      return "unsigned char";
    default:
      return nullptr;
  }
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

}  // namespace

void validate_user_variant(const UserVariant& variant, const char* what) {
  FLARE_CHECK(is_c_identifier(variant.name), ErrorCode::kInvalidArgument, what,
              ": variant.name must be a C identifier, got '", variant.name, "'");
  FLARE_CHECK(variant.source.find_first_not_of(" \t\r\n") != std::string::npos,
              ErrorCode::kInvalidArgument, what, ": variant '", variant.name,
              "' has an empty source (it must define struct Variant)");
  FLARE_CHECK(variant.scalars.size() <= static_cast<size_t>(kMaxUserScalars),
              ErrorCode::kInvalidArgument, what, ": variant '", variant.name, "' declares ",
              variant.scalars.size(), " scalars; at most ", kMaxUserScalars);
  FLARE_CHECK(variant.tensors.size() <= static_cast<size_t>(kMaxUserTensors),
              ErrorCode::kInvalidArgument, what, ": variant '", variant.name, "' declares ",
              variant.tensors.size(), " tensors; at most ", kMaxUserTensors);
  std::vector<std::string> names;
  for (size_t i = 0; i < variant.scalars.size(); ++i) {
    const std::string& scalar = variant.scalars[i];
    FLARE_CHECK(is_c_identifier(scalar), ErrorCode::kInvalidArgument, what, ": variant '",
                variant.name, "' scalar ", i, " must be a C identifier, got '", scalar, "'");
    FLARE_CHECK(std::find(names.begin(), names.end(), scalar) == names.end(),
                ErrorCode::kInvalidArgument, what, ": variant '", variant.name,
                "' declares scalar '", scalar, "' twice");
    names.push_back(scalar);
  }
  for (size_t i = 0; i < variant.tensors.size(); ++i) {
    const UserVariantTensor& tensor = variant.tensors[i];
    FLARE_CHECK(is_c_identifier(tensor.name), ErrorCode::kInvalidArgument, what, ": variant '",
                variant.name, "' tensor ", i, " must be a C identifier, got '", tensor.name, "'");
    FLARE_CHECK(std::find(names.begin(), names.end(), tensor.name) == names.end(),
                ErrorCode::kInvalidArgument, what, ": variant '", variant.name, "' declares '",
                tensor.name, "' twice (scalars and tensors share names)");
    FLARE_CHECK(element_type(tensor.dtype) != nullptr, ErrorCode::kInvalidArgument, what,
                ": variant '", variant.name, "' tensor ", tensor.name, " has dtype ",
                dtype_name(tensor.dtype),
                "; variant tensors are float32, float16, bfloat16, int32, int64 or uint8");
    for (const int64_t extent : tensor.shape) {
      FLARE_CHECK(extent >= kTableExtent, ErrorCode::kInvalidArgument, what, ": variant '",
                  variant.name, "' tensor ", tensor.name, " declares extent ", extent,
                  "; extents are >= 0, kAnyExtent, kBatchExtent, kQoHeadsExtent, "
                  "kKvHeadsExtent or kTableExtent");
    }
    names.push_back(tensor.name);
  }
  // Each tensor's extents come as Tensors::<name>_extent: no tensor may take that name.
  for (const UserVariantTensor& a : variant.tensors) {
    for (const UserVariantTensor& b : variant.tensors) {
      FLARE_CHECK(b.name != a.name + "_extent", ErrorCode::kInvalidArgument, what, ": variant '",
                  variant.name, "' tensor ", b.name, " collides with tensor ", a.name,
                  "'s extent accessor (Tensors::", a.name, "_extent)");
    }
  }
}

std::string user_variant_source(const UserVariant& variant) {
  std::string source = "#include \"variant.cuh\"\nstruct Scalars {\n";
  for (size_t i = 0; i < variant.scalars.size(); ++i) {
    source += "  __device__ static float " + variant.scalars[i] +
              "(const flare::VariantParams& p) { return p.scalars[" + std::to_string(i) + "]; }\n";
  }
  source += "};\nstruct Tensors {\n";
  for (size_t i = 0; i < variant.tensors.size(); ++i) {
    const std::string type = element_type(variant.tensors[i].dtype);
    source += "  __device__ static const " + type + "* " + variant.tensors[i].name +
              "(const flare::VariantParams& p) { return static_cast<const " + type +
              "*>(p.tensors[" + std::to_string(i) + "]); }\n";
    source += "  __device__ static int " + variant.tensors[i].name +
              "_extent(const flare::VariantParams& p, int d) { return p.tensor_extents[" +
              std::to_string(i) + "][d]; }\n";
  }
  source += "};\n#line 1 \"" + variant.name + "\"\n" + variant.source;
  if (source.back() != '\n') source += '\n';
  const char* declared = variant.use_softmax ? "true" : "false";
  source += "#line 1 \"" + variant.name + ": use_softmax check\"\n";
  source += "static_assert(Variant::use_softmax == " + std::string(declared) + ", \"variant '" +
            variant.name + "' was declared with use_softmax = " + declared +
            " but its source's struct Variant says otherwise: make them agree\");\n";
  return source;
}

int user_variant_scalar_index(const UserVariant& variant, const std::string& scalar,
                              const char* what) {
  const auto found = std::find(variant.scalars.begin(), variant.scalars.end(), scalar);
  FLARE_CHECK(found != variant.scalars.end(), ErrorCode::kInvalidArgument, what, ": variant '",
              variant.name, "' has no scalar '", scalar,
              "' (its scalars: ", joined(variant.scalars), ")");
  return static_cast<int>(found - variant.scalars.begin());
}

}  // namespace flare
