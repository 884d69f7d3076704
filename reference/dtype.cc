// Table of element types (see dtype.h).
#include "reference/dtype.h"

#include <array>

namespace attest {
namespace {

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kF64, "f64", "F64", 8, true},
    {DType::kF32, "f32", "F32", 4, true},
    {DType::kBF16, "bf16", "BF16", 2, true},
    {DType::kF16, "f16", "F16", 2, true},
    {DType::kE4M3FN, "e4m3fn", "F8_E4M3", 1, true},
    {DType::kE5M2, "e5m2", "F8_E5M2", 1, true},
    {DType::kE8M0FNU, "e8m0fnu", "F8_E8M0", 1, true},
    {DType::kU8, "u8", "U8", 1, false},
    {DType::kI32, "i32", "I32", 4, false},
    {DType::kI64, "i64", "I64", 8, false},
}};

struct Alias {
  std::string_view alias;
  DType dtype;
};
constexpr std::array<Alias, 9> kAliases = {{
    {"fp64", DType::kF64},
    {"float64", DType::kF64},
    {"fp32", DType::kF32},
    {"float32", DType::kF32},
    {"bfloat16", DType::kBF16},
    {"fp16", DType::kF16},
    {"float16", DType::kF16},
    {"float8_e4m3fn", DType::kE4M3FN},
    {"float8_e5m2", DType::kE5M2},
}};

}  // namespace

std::span<const DTypeInfo> AllDTypes() { return kDTypes; }

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& row : kDTypes) {
    if (row.name == name) return row.dtype;
  }
  for (const auto& row : kAliases) {
    if (row.alias == name) return row.dtype;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  for (const auto& row : kDTypes) {
    if (row.safetensors == name) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace attest
