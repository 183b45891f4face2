// The compressed block mask (BlockMaskLists, FlexAttention's layout: per query block the lists
// of partial and full key blocks) and the bias and masks on varlen calls (issue 18): values and
// gradients against the float64 reference given the equivalent dense keep mask and bias, at
// ragged lengths; full blocks do not read attn_mask; the lists give bitwise the dense form's
// results; absent blocks are never read; list values are checked. CUDA runs each case in
// bfloat16 (float32 is CPU-only), gradients included (score_mods_util.h run_and_check).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "block_sparse_case.h"
#include "score_mods_util.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

using namespace block_sparse_case;  // NOLINT(google-build-using-namespace): the cases' vocabulary

std::vector<Spec> cases() {
  std::vector<Spec> cs;
  Spec s;
  s.name = "lists_mixed_bias_mask_gqa";
  s.blocks = Blocks::kLists, s.bias = true, s.mask_density = 0.7;
  cs.push_back(s);
  s.name = "lists_density_0";
  s.absent = 1.0, s.bias_dims = {1, 0, 1};
  cs.push_back(s);
  s.name = "lists_density_1_all_full";  // attn_mask is zero in full blocks: never read
  s.absent = 0.0, s.partial = 0.0;
  cs.push_back(s);
  s.name = "lists_all_partial";
  s.absent = 0.0, s.partial = 1.0;
  cs.push_back(s);
  s = Spec{};
  s.name = "lists_causal_window_softcap_alibi";
  s.blocks = Blocks::kLists, s.bias = true, s.bias_dims = {1, 0, 0}, s.mask_density = 0.8;
  s.causal = true, s.window_left = 50, s.softcap = 3.0f, s.alibi = true;
  s.lens_q = {130, 130}, s.lens_k = {170, 170}, s.block_q = 16, s.block_k = 32;
  cs.push_back(s);
  s = Spec{};
  s.name = "lists_partial_only_no_mask";  // partial blocks without attn_mask: fully visible
  s.blocks = Blocks::kLists, s.full_list = false, s.block_batch = true, s.block_heads = false;
  cs.push_back(s);
  s = Spec{};
  s.name = "lists_full_only_mqa";
  s.blocks = Blocks::kLists, s.partial_list = false, s.mask_density = 0.5, s.heads_k = 1;
  s.block_batch = true, s.block_q = 7, s.block_k = 64;
  cs.push_back(s);
  s = Spec{};
  s.name = "varlen_bias_dbias_ragged";  // empty sequences on either side
  s.varlen = true, s.bias = true;
  s.lens_q = {37, 1, 130, 0, 20}, s.lens_k = {53, 77, 200, 10, 0};
  cs.push_back(s);
  s.name = "varlen_bias_batch_broadcast_causal_mask";  // (1, heads, rows, cols): one bias for all
  s.bias_dims = {1, 0, 0}, s.causal = true, s.mask_density = 0.6;
  cs.push_back(s);
  s.name = "varlen_bias_key_padding_gqa";  // (batch, 1, 1, cols), shared by the kv heads
  s.bias_dims = {0, 1, 1}, s.causal = false, s.mask_density = -1.0;
  cs.push_back(s);
  s = Spec{};
  s.name = "varlen_dense_block_mask_window_max_seqlen_0";
  s.varlen = true, s.blocks = Blocks::kDense, s.mask_density = 0.7, s.pass_max_seqlen = false;
  s.window_left = 30, s.window_right = 10, s.block_batch = true;
  s.lens_q = {90, 64, 3}, s.lens_k = {100, 64, 129};
  cs.push_back(s);
  s = Spec{};
  s.name = "varlen_lists_bias_softcap";
  s.varlen = true, s.blocks = Blocks::kLists, s.bias = true, s.bias_dims = {1, 1, 0};
  s.mask_density = 0.6, s.softcap = 2.0f, s.block_batch = true;
  s.lens_q = {90, 200, 1}, s.lens_k = {150, 64, 65};
  cs.push_back(s);
  s.name = "varlen_lists_bf16";
  s.dtype = DType::kBFloat16;
  cs.push_back(s);
  uint32_t seed = 2800;
  for (Spec& c : cs) c.seed = seed++;
  return cs;
}

using Param = std::tuple<Backend, size_t>;
class BlockSparse : public testing::TestWithParam<Param> {};

TEST_P(BlockSparse, MatchesReference) {
  const auto [backend, index] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  Spec s = cases()[index];
  if (backend == Backend::kCuda && !s.pass_max_seqlen) GTEST_SKIP() << "CUDA varlen needs max_seqlen";
  if (backend == Backend::kCuda && s.dtype == DType::kFloat32) s.dtype = DType::kBFloat16;
  if (backend == Backend::kCuda && cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not built";
  Built b = build(s, backend);
  const ModsRefs refs = run_and_check(backend, b, options(s, b), s.dtype, s.name);
  if (s.absent == 1.0 && s.blocks != Blocks::kNone) {
    for (double x : b.outv.read()) ASSERT_EQ(x, 0.0);
  }
  expect_unreached_dbias_zero(b, refs, s.name);
}

INSTANTIATE_TEST_SUITE_P(All, BlockSparse,
                         testing::Combine(testing::ValuesIn(all_backends()),
                                          testing::Range<size_t>(0, cases().size())),
                         [](const testing::TestParamInfo<Param>& p) {
                           return std::string(backend_name(std::get<0>(p.param))) + "_" +
                                  cases()[std::get<1>(p.param)].name;
                         });

// The dense block mask with attn_mask and the lists that classify each kept block (full where
// attn_mask keeps all of it, else partial) describe one mask: the results are bitwise equal.
TEST(BlockSparseCpu, ListsEqualTheDenseFormBitwise) {
  Spec s;
  s.blocks = Blocks::kDense, s.mask_density = 0.9, s.bias = true, s.causal = true;
  s.block_q = 8, s.block_k = 8, s.seed = 31;
  Built dense = build(s, Backend::kCpu);
  // Make about half the kept blocks all-true in attn_mask.
  std::vector<double> mask = dense.mask;
  const int H = s.heads, Sq = dense.max_q, Sk = dense.max_k;
  for (size_t e = 0; e < mask.size(); ++e) {
    const int j = static_cast<int>(e % Sk), i = static_cast<int>(e / Sk % Sq);
    if ((i / s.block_q + j / s.block_k) % 2 == 0) mask[e] = 1.0;
  }
  dense.maskv.write(mask);
  dense.maskv.arena->upload();
  ASSERT_TRUE(forward(forward_args(s, dense)).ok());
  ASSERT_TRUE(backward(backward_args(s, dense)).ok());
  for (View* v : {&dense.outv, &dense.lsev, &dense.dqv, &dense.dkv, &dense.dvv, &dense.dbiasv}) {
    v->arena->download();
  }

  // The lists: per (h, r) the kept blocks, full where the mask keeps every element of the block
  // for every sequence (the lists broadcast over the batch, like the dense mask here).
  Built lists = build(s, Backend::kCpu);
  lists.maskv.write(mask);
  lists.maskv.arena->upload();
  std::vector<int> states(dense.states.size());
  for (int h = 0; h < H; ++h) {
    for (int r = 0; r < dense.nqb; ++r) {
      for (int c = 0; c < dense.nkb; ++c) {
        const size_t e = (static_cast<size_t>(h) * dense.nqb + r) * dense.nkb + c;
        if (dense.states[e] == kAbsent) {
          states[e] = kAbsent;
          continue;
        }
        bool all = true;
        for (int bb = 0; bb < dense.batch; ++bb) {
          for (int i = r * s.block_q; i < std::min(Sq, (r + 1) * s.block_q); ++i) {
            for (int j = c * s.block_k; j < std::min(Sk, (c + 1) * s.block_k); ++j) {
              all = all && mask[((static_cast<size_t>(bb) * H + h) * Sq + i) * Sk + j] != 0.0;
            }
          }
        }
        states[e] = all ? kFull : kPartial;
      }
    }
  }
  ASSERT_NE(std::count(states.begin(), states.end(), kFull), 0);
  ASSERT_NE(std::count(states.begin(), states.end(), kPartial), 0);
  std::mt19937 g(5);
  set_lists(&lists, Backend::kCpu, states, 1, H, dense.nkb, g);
  lists.blockv = View{};
  ASSERT_TRUE(forward(forward_args(s, lists)).ok());
  ASSERT_TRUE(backward(backward_args(s, lists)).ok());
  const char* names[] = {"out", "lse", "dq", "dk", "dv", "dbias"};
  View* ours[] = {&lists.outv, &lists.lsev, &lists.dqv, &lists.dkv, &lists.dvv, &lists.dbiasv};
  View* theirs[] = {&dense.outv, &dense.lsev, &dense.dqv, &dense.dkv, &dense.dvv, &dense.dbiasv};
  for (int t = 0; t < 6; ++t) {
    ours[t]->arena->download();
    EXPECT_EQ(ours[t]->arena->bytes(), theirs[t]->arena->bytes()) << names[t];
  }
}

// Blocks absent from the lists are skipped entirely: keys only they cover are never loaded, so
// NaN in those K and V rows reaches nothing. Key block 1 (keys 64..127) is listed nowhere.
TEST(BlockSparseCpu, UnlistedBlocksAreNotRead) {
  Spec s;
  s.blocks = Blocks::kLists, s.absent = 0.0, s.partial = 0.5, s.mask_density = 0.8;
  s.lens_q = {80, 80}, s.lens_k = {200, 200}, s.block_q = 16, s.block_k = 64, s.seed = 41;
  {
    // Rebuild the lists without key block 1.
    Built b = build(s, Backend::kCpu);
    unlist_key_block(&b, Backend::kCpu, s, 1, 7);
    ASSERT_TRUE(forward(forward_args(s, b)).ok());
    b.outv.arena->download();
    for (double x : b.outv.read()) ASSERT_TRUE(std::isfinite(x));
    ASSERT_TRUE(backward(backward_args(s, b)).ok());
    b.dqv.arena->download();
    for (double x : b.dqv.read()) ASSERT_TRUE(std::isfinite(x));
  }
}

// The lists' values are checked on the host (CPU tensors), naming the entry.
TEST(BlockSparseCpu, ListErrors) {
  Spec s;
  s.blocks = Blocks::kLists, s.lens_q = {40, 40}, s.lens_k = {50, 50}, s.block_q = 16, s.block_k = 16;
  s.absent = 0.0, s.partial = 0.5, s.seed = 51;  // every block listed: 3 x 4 blocks
  Built b = build(s, Backend::kCpu);
  auto expect = [&](const ForwardArgs& a, const std::string& needle) {
    const Status st = forward(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  ASSERT_TRUE(forward(forward_args(s, b)).ok());
  const auto with_counts = [&](View& v, const std::vector<double>& values) {
    const std::vector<double> saved = v.read();
    v.write(values);
    v.arena->upload();
    return saved;
  };
  // A count above the width of the index tensor (width = 4 + 3 key blocks).
  std::vector<double> counts = b.full_numv.read();
  std::vector<double> bad = counts;
  bad[0] = 8;
  with_counts(b.full_numv, bad);
  expect(forward_args(s, b), "full_kv_num_blocks[0, 0, 0] = 8 is outside [0, 7]");
  bad[0] = -1;
  with_counts(b.full_numv, bad);
  expect(forward_args(s, b), "full_kv_num_blocks[0, 0, 0] = -1");
  with_counts(b.full_numv, counts);
  // An index past the key blocks, and a block listed twice (once in each list), in a query
  // block whose lists are both non-empty.
  const std::vector<double> num = b.numv.read(), full_num = b.full_numv.read();
  size_t at = 0;
  while (at < num.size() && (num[at] == 0.0 || full_num[at] == 0.0)) ++at;
  ASSERT_LT(at, num.size());
  const std::string hr = std::to_string(at / b.nqb) + ", " + std::to_string(at % b.nqb);
  std::vector<double> idx = b.idxv.read();
  std::vector<double> bad_idx = idx;
  const size_t row = at * static_cast<size_t>(b.nkb + 3);
  bad_idx[row] = 4;
  with_counts(b.idxv, bad_idx);
  expect(forward_args(s, b), "kv_indices[0, " + hr + ", 0] = 4 is outside [0, 4)");
  bad_idx[row] = b.full_idxv.read()[row];
  with_counts(b.idxv, bad_idx);
  expect(forward_args(s, b), "is listed twice for query block " + std::to_string(at % b.nqb) +
                                 " of (batch 0, head " + std::to_string(at / b.nqb) + ")");
  with_counts(b.idxv, idx);
  ASSERT_TRUE(forward(forward_args(s, b)).ok());

  ForwardArgs a = forward_args(s, b);
  a.block_mask_lists.kv_indices = TensorView{};
  expect(a, "kv_num_blocks and kv_indices must be given together; got only kv_num_blocks");
  a = forward_args(s, b);
  a.block_mask_lists.kv_num_blocks.shape[2] = 2;
  expect(a, "kv_num_blocks must have shape (batch|1, heads|1, ceil(seqlen_q / block_size_q)) with");
  a = forward_args(s, b);
  a.block_mask_lists.full_kv_indices.dtype = DType::kFloat32;
  expect(a, "full_kv_indices must have dtype int32");
  a = forward_args(s, b);
  a.block_size_q = 0;
  expect(a, "block_size_q and block_size_k must be >= 1");
  a = forward_args(s, b);
  const std::vector<double> ones(static_cast<size_t>(b.nqb * b.nkb), 1.0);
  View dense = upload(Backend::kCpu, DType::kUInt8, Layout::kContiguous, {1, 1, b.nqb, b.nkb}, ones);
  a.block_mask = dense.tensor();
  expect(a, "block_mask and block_mask_lists (its compressed form) were both given");
}

}  // namespace
}  // namespace flashattn::test
