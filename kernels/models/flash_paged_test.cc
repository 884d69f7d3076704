// Paged KV and seqused in the CPU engine and its models (flash_engine_paged.cc, kernel.h
// Capabilities::paged / seqused; docs/semantics.md "Paged KV and seqused"): cpu/flash2-bf16 on
// generated cases (NaN, +-30000 and other sequences' rows wherever nothing may be read) returns
// bitwise what it returns for the same logical problem with contiguous k, v, finite outputs,
// empty rows past seqused_q and zero dk, dv on unread slots, and stays near the float64
// oracle; kernels that do not claim the capabilities are not covered; the JSON keys.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/models/flash_models.h"
#include "reference/data/generate.h"
#include "reference/formats/format.h"
#include "reference/oracle/oracle.h"
#include "reference/oracle/oracle_test_util.h"
#include "reference/problem/paged.h"

namespace attest {
namespace {

template <class T>
T Take(KernelAnswer<T> answer, const std::string& what) {
  if (auto* u = std::get_if<Unsupported>(&answer)) ADD_FAILURE() << what << ": " << u->reason;
  if (auto* e = std::get_if<Error>(&answer)) ADD_FAILURE() << what << ": " << e->message;
  if (!std::holds_alternative<T>(answer)) return T{};
  return std::get<T>(std::move(answer));
}

struct Outputs {
  Tensor o, lse, dq, dk, dv;
};

GeneratedInputs Inputs(const Problem& p) {
  auto in = GenerateInputs(p, GeneratorSpec{"gaussian", 11, nlohmann::json::object()});
  EXPECT_TRUE(in.ok());
  for (Tensor* t : {&in->q, &in->k, &in->v, &in->dout}) RoundTensorInPlace(*t, p.dtype);
  return std::move(*in);
}

Outputs RunModel(Kernel& kernel, const Problem& p, const GeneratedInputs& in) {
  const ForwardResult f = Take(kernel.Forward(p, in.q, in.k, in.v), p.paged() ? "paged" : "flat");
  const BackwardResult b = Take(kernel.Backward(p, in.q, in.k, in.v, f.o, f.lse, in.dout), "bwd");
  return {ToF64(f.o), ToF64(f.lse), ToF64(b.dq), ToF64(b.dk), ToF64(b.dv)};
}

std::vector<Problem> Problems() {
  std::vector<Problem> out;
  Problem a = oracle_test::Base(2, 4, 2, 70, 150, 64, 64);
  a.page_size = 16;
  out.push_back(a);  // pages only
  Problem b = a;
  b.causal = true;
  b.seqused_q = std::vector<int32_t>{70, 9};
  b.seqused_k = std::vector<int32_t>{117, 3};  // 3 keys, 9 queries: empty rows
  out.push_back(b);
  Problem c = oracle_test::Base(3, 2, 2, 40, 50, 32, 32);
  c.page_size = 8;
  c.cu_seqlens_q = std::vector<int32_t>{0, 40, 45, 45};
  c.cu_seqlens_k = std::vector<int32_t>{0, 50, 63, 100};
  c.window_left = 7;
  c.window_right = 2;
  c.seqused_k = std::vector<int32_t>{45, 13, 29};
  out.push_back(c);
  for (Problem& p : out) FillPagedDefaults(p);
  return out;
}

Tensor PoolOf(const Problem& paged, const Tensor& contiguous_grad) {
  Problem flat = paged;
  flat.page_size = flat.num_pages = 0;
  flat.page_table.reset();
  const int64_t rank = contiguous_grad.rank();
  const Shape shape{paged.num_pages, paged.page_size, contiguous_grad.dim(rank - 2),
                    contiguous_grad.dim(rank - 1)};
  std::vector<int64_t> rows;
  std::vector<int64_t> from;
  for (int64_t b = 0; b < paged.batch; ++b) {
    const Sequence s = SequenceOf(flat, b);
    for (int64_t j = 0; j < s.k_len; ++j) {
      rows.push_back(KeyRow(paged, b, j));
      from.push_back(s.k_begin + j);
    }
  }
  return ScatterRows(GatherRows(contiguous_grad, from), rows, shape, 0.0);
}

TEST(FlashPaged, PagedIsBitwiseTheContiguousRunAndNearTheOracle) {
  auto kernel = std::make_unique<Flash2Model>("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  for (const Problem& p : Problems()) {
    Problem flat = p;
    flat.page_size = flat.num_pages = 0;
    flat.page_table.reset();
    const GeneratedInputs in = Inputs(p), flat_in = Inputs(flat);
    const Outputs x = RunModel(*kernel, p, in), y = RunModel(*kernel, flat, flat_in);
    EXPECT_TRUE(x.o.BitwiseEqual(y.o));
    EXPECT_TRUE(x.lse.BitwiseEqual(y.lse));
    EXPECT_TRUE(x.dq.BitwiseEqual(y.dq));
    EXPECT_TRUE(x.dk.BitwiseEqual(PoolOf(p, y.dk)));
    EXPECT_TRUE(x.dv.BitwiseEqual(PoolOf(p, y.dv)));
    for (const Tensor* t : {&x.o, &x.dq, &x.dk, &x.dv}) {
      for (double e : t->span<const double>()) ASSERT_TRUE(std::isfinite(e));
    }
    const BackwardOut ref = Backward<double>(p, in.q, in.k, in.v, in.dout);
    EXPECT_TRUE(ToF64(x.lse).BitwiseEqual(x.lse));
    const std::pair<const Tensor*, const Tensor*> pairs[] = {
        {&x.o, &ref.o}, {&x.lse, &ref.lse}, {&x.dq, &ref.dq}, {&x.dk, &ref.dk}, {&x.dv, &ref.dv}};
    for (const auto& [got, want] : pairs) {
      const double err = oracle_test::MaxAbsDiff(*got, *want);
      EXPECT_LE(err, 0.05 * std::max(1.0, oracle_test::MaxAbs(*want)));
    }
  }
}

TEST(FlashPaged, CapabilitiesCoverAndJson) {
  const Flash2Model flash("cpu/flash2-bf16", *FindRecipe("bf16"), DType::kBF16);
  const Tile64Model tile;
  const Capabilities caps = flash.capabilities();
  EXPECT_TRUE(caps.paged && caps.seqused);
  std::string why;
  Problem seqused = oracle_test::Base(1, 1, 1, 64, 64, 64, 64);
  seqused.seqused_k = std::vector<int32_t>{10};
  Problem paged = seqused;
  paged.seqused_k.reset();
  paged.page_size = 16;
  FillPagedDefaults(paged);
  EXPECT_FALSE(tile.capabilities().Covers(seqused, &why));
  EXPECT_EQ(why, "seqused");
  EXPECT_FALSE(tile.capabilities().Covers(paged, &why));
  EXPECT_EQ(why, "paged");
  const nlohmann::json j = CapabilitiesToJson(caps);
  EXPECT_EQ(j.at("paged"), true);
  EXPECT_EQ(j.at("seqused"), true);
  const auto back = CapabilitiesFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->paged && back->seqused);
  Capabilities none;
  EXPECT_FALSE(CapabilitiesToJson(none).contains("paged"));
}

}  // namespace
}  // namespace attest
