// Element types a Tensor can hold, with their attest spelling (docs/design.md: "f64 f32 bf16 f16
// e4m3fn e5m2 e8m0fnu") and safetensors spelling (safetensors/src/tensor.rs `Dtype`:
// F64 F32 BF16 F16 F8_E4M3 F8_E5M2 F8_E8M0 U8 I32 I64). Low-precision floats are stored as
// their raw codes (uint16_t / uint8_t); reference/formats decodes them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace attest {

enum class DType : uint8_t {
  kF64,
  kF32,
  kBF16,
  kF16,
  kE4M3FN,
  kE5M2,
  kE8M0FNU,
  kU8,
  kI32,
  kI64,
};

struct DTypeInfo {
  DType dtype;
  std::string_view name;         // attest spelling, used in JSON and on the command line
  std::string_view safetensors;  // safetensors header spelling
  int size;                      // bytes per element
  bool is_float;                 // a floating-point (or scale) format, as opposed to integers
};

// One row per DType, in enum order.
std::span<const DTypeInfo> AllDTypes();
const DTypeInfo& Info(DType dtype);
inline std::string_view Name(DType dtype) { return Info(dtype).name; }
inline int SizeOf(DType dtype) { return Info(dtype).size; }

// Parse an attest name ("bf16"); also accepts the common aliases "fp16", "float16",
// "bfloat16", "fp32", "float32", "fp64", "float64".
std::optional<DType> ParseDType(std::string_view name);
// Parse a safetensors dtype string ("BF16").
std::optional<DType> DTypeFromSafetensors(std::string_view name);

// The C++ storage type of each dtype (the raw code type for low-precision floats).
template <DType D>
struct StorageOf;
template <> struct StorageOf<DType::kF64> { using type = double; };
template <> struct StorageOf<DType::kF32> { using type = float; };
template <> struct StorageOf<DType::kBF16> { using type = uint16_t; };
template <> struct StorageOf<DType::kF16> { using type = uint16_t; };
template <> struct StorageOf<DType::kE4M3FN> { using type = uint8_t; };
template <> struct StorageOf<DType::kE5M2> { using type = uint8_t; };
template <> struct StorageOf<DType::kE8M0FNU> { using type = uint8_t; };
template <> struct StorageOf<DType::kU8> { using type = uint8_t; };
template <> struct StorageOf<DType::kI32> { using type = int32_t; };
template <> struct StorageOf<DType::kI64> { using type = int64_t; };

}  // namespace attest
