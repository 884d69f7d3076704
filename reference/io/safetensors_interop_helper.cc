// Test helper for safetensors_interop_test.py (interop with huggingface/safetensors):
//   safetensors_interop_helper write-numpy PATH   F64 F32 F16 I32 I64 U8 tensors (numpy dtypes)
//   safetensors_interop_helper write-all PATH     every attest dtype, a strided view, metadata
//   safetensors_interop_helper dump PATH          what our reader reads, as JSON (bytes in hex)
// Tensor values are formulas of the row-major element index e, restated in the Python test.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "reference/io/safetensors.h"

namespace attest {
namespace {

template <class T, class F>
Tensor Fill(DType dtype, Shape shape, F f) {
  Tensor t = Tensor::Zeros(dtype, std::move(shape));
  auto s = t.span<T>();
  for (size_t e = 0; e < s.size(); ++e) s[e] = static_cast<T>(f(static_cast<int64_t>(e)));
  return t;
}

NamedTensors NumpyTensors() {
  NamedTensors nt;
  nt.Add("f64", Fill<double>(DType::kF64, {2, 3}, [](int64_t e) { return e * 0.5 - 1.0; }));
  nt.Add("f32", Fill<float>(DType::kF32, {4}, [](int64_t e) { return e * 0.25f - 3.0f; }));
  // f16 codes 0x3c00 + e: 1.0 and its successors.
  nt.Add("f16", Fill<uint16_t>(DType::kF16, {5}, [](int64_t e) { return 0x3c00 + e; }));
  nt.Add("i32", Fill<int32_t>(DType::kI32, {2, 2}, [](int64_t e) { return 1 - 7 * e; }));
  nt.Add("i64",
         Fill<int64_t>(DType::kI64, {3}, [](int64_t e) { return e * (int64_t{1} << 40) - 5; }));
  nt.Add("u8", Fill<uint8_t>(DType::kU8, {2, 1, 3}, [](int64_t e) { return e * 3; }));
  nt.Add("empty", Tensor::Zeros(DType::kF32, {0, 4}));
  nt.Add("scalar", Fill<double>(DType::kF64, {}, [](int64_t) { return 2.5; }));
  // A strided view: the transpose of t[i][j] = 10 i + j, shape [3, 2] -> [2, 3].
  nt.Add("f64_transposed", Fill<double>(DType::kF64, {3, 2}, [](int64_t e) {
                             return 10.0 * (e / 2) + e % 2;
                           }).Permute({1, 0}));
  return nt;
}

NamedTensors AllTensors() {
  NamedTensors nt = NumpyTensors();
  nt.Add("bf16", Fill<uint16_t>(DType::kBF16, {2, 2}, [](int64_t e) { return 0x3f80 + e; }));
  nt.Add("e4m3", Fill<uint8_t>(DType::kE4M3FN, {3}, [](int64_t e) { return 0x38 + e; }));
  nt.Add("e5m2", Fill<uint8_t>(DType::kE5M2, {3}, [](int64_t e) { return 0x3c + e; }));
  nt.Add("e8m0", Fill<uint8_t>(DType::kE8M0FNU, {3}, [](int64_t e) { return 127 + e; }));
  // One metadata key: the reference writer keeps metadata in a HashMap, so only a single
  // key has a reproducible order for the byte-identity check.
  nt.metadata["writer"] = "attest";
  return nt;
}

std::string Hex(const Tensor& t) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int64_t i = 0; i < t.nbytes(); ++i) {
    const auto b = static_cast<unsigned>(t.bytes()[i]);
    out += kHex[b >> 4];
    out += kHex[b & 0xF];
  }
  return out;
}

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " write-numpy|write-all|dump PATH\n";
    return 2;
  }
  const std::string mode = argv[1];
  const std::string path = argv[2];
  if (mode == "write-numpy" || mode == "write-all") {
    Status s = WriteSafetensors(path, mode == "write-all" ? AllTensors() : NumpyTensors());
    if (!s.ok()) {
      std::cerr << s.error().message << "\n";
      return 2;
    }
    return 0;
  }
  if (mode == "dump") {
    auto r = ReadSafetensors(path);
    if (!r.ok()) {
      std::cerr << r.error().message << "\n";
      return 2;
    }
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& [name, t] : r->tensors) {
      tensors.push_back({{"name", name},
                         {"dtype", Info(t.dtype()).safetensors},
                         {"shape", t.shape()},
                         {"hex", Hex(t)}});
    }
    std::cout << nlohmann::json{{"tensors", tensors}, {"metadata", r->metadata}}.dump() << "\n";
    return 0;
  }
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}

}  // namespace
}  // namespace attest

int main(int argc, char** argv) { return attest::Main(argc, argv); }
