// The CUDA forward and backward with block masks (dense and compressed), attn_bias and attn_mask
// (issue 18; sm80 kernels, ScoreMods::kBiasMask): out, lse, dq, dk, dv and dbias against the
// float64 reference given the equivalent dense keep mask and bias, with the naive low-precision
// attention as the error yardstick (score_mods_util.h run_and_check). Cases cover
// block sizes that align with the kernel tiles (128 x 128 as FlexAttention uses, 64 x 64) and
// ones that do not (96 x 80, 1 x 64), densities 0 and 1, rows with no kept block, ragged and
// varlen lengths, bias in float32 and bfloat16 with every broadcast pattern of dbias (full,
// (B, 1, 1, Nk), (1, H, Nq, Nk), (1, 1, Nq, Nk), (B, H, 1, Nk), (1, 1, 1, Nk)), GQA, causal and
// windowed masks, softcap, ALiBi, dropout, split-KV and the decode shape; every case also runs
// the deterministic backward (dQ kernel), which must be bitwise repeatable; dbias with softcap
// (the sm80 backward's kFactorLater instantiation) and softcap with a bias but no dbias. Differential tests: CUDA against
// the CPU backend (dbias included), split-KV against one split, and NaN in keys only absent
// blocks cover (never loaded, forward and backward); the first GPU run's failing pattern (a
// float32 bias summed over the query rows, causal, atomics dQ) repeated, bitwise in both dQ
// modes. SparseSm90: the Hopper forward's block-sparse kernels against the reference and against
// the sm80 forward in the same process. SparseSm90Bwd: the Hopper backward's block-sparse kernels
// (both dQ modes) against the reference and against the sm80 backward in the same process, and
// that the dispatcher sends block-mask backwards there (and attn_bias ones not). Every case skips
// without a GPU. Label `sparse`: `ctest -L sparse`.
#include <gtest/gtest.h>

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "block_sparse_case.h"
#include "score_mods_util.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

using namespace block_sparse_case;  // NOLINT(google-build-using-namespace): the cases' vocabulary

// A CUDA case at the CI build's head dim (128), bfloat16.
Spec cuda_spec(const std::string& name) {
  Spec s;
  s.name = name;
  s.dtype = DType::kBFloat16;
  s.head_dim = s.head_dim_v = 128;
  s.lens_q = {300, 300}, s.lens_k = {520, 520};  // not multiples of any tile
  return s;
}

std::vector<Spec> cases() {
  std::vector<Spec> cs;
  Spec s = cuda_spec("dense_128x128_density_10");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 0.9, s.partial = 0.0;
  s.lens_q = {1000, 1000}, s.lens_k = {1000, 1000};
  cs.push_back(s);
  s = cuda_spec("lists_128x128_partial_mask_bias_gqa");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.mask_density = 0.7, s.bias = true;
  s.heads = 8, s.heads_k = 2;
  cs.push_back(s);
  s = cuda_spec("lists_64x64_mixed_per_batch");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 64, s.mask_density = 0.6, s.block_batch = true;
  cs.push_back(s);
  s = cuda_spec("lists_96x80_unaligned_mask");
  s.blocks = Blocks::kLists, s.block_q = 96, s.block_k = 80, s.mask_density = 0.8;
  cs.push_back(s);
  s = cuda_spec("dense_96x80_unaligned_causal_gqa");
  s.blocks = Blocks::kDense, s.block_q = 96, s.block_k = 80, s.causal = true;
  s.lens_q = {700, 700}, s.lens_k = {900, 900}, s.heads = 8, s.heads_k = 2;
  cs.push_back(s);
  s = cuda_spec("dense_density_0");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 1.0;
  cs.push_back(s);
  s = cuda_spec("lists_density_1_all_full");  // attn_mask is zero in full blocks: never read
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.absent = 0.0, s.partial = 0.0, s.mask_density = 0.5;
  cs.push_back(s);
  s = cuda_spec("dense_density_1_window");
  s.blocks = Blocks::kDense, s.block_q = 64, s.block_k = 128, s.absent = 0.0, s.window_left = 100, s.window_right = 30;
  cs.push_back(s);
  s = cuda_spec("bias_f32_heads_softcap_alibi_blocks");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.bias = true, s.bias_dims = {1, 0, 0};
  s.softcap = 5.0f, s.alibi = true;
  cs.push_back(s);
  s = cuda_spec("bias_bf16_key_padding_window");
  s.bias = true, s.bias_dims = {0, 1, 1}, s.bias_dtype = DType::kBFloat16, s.window_left = 64, s.window_right = 0;
  cs.push_back(s);
  s = cuda_spec("bias_bf16_full_mask_dropout");
  s.bias = true, s.bias_dtype = DType::kBFloat16, s.mask_density = 0.5, s.dropout_p = 0.15f;
  cs.push_back(s);
  s = cuda_spec("mask_only_sparse_rows");
  s.mask_density = 0.01;  // many rows keep nothing
  cs.push_back(s);
  s = cuda_spec("varlen_lists_128_bias_mask_ragged");
  s.varlen = true, s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.bias = true, s.mask_density = 0.6;
  s.block_batch = true, s.lens_q = {37, 1, 400, 0, 129}, s.lens_k = {53, 300, 260, 10, 0};
  cs.push_back(s);
  s = cuda_spec("varlen_dense_96x80_causal_bias_bf16");
  s.varlen = true, s.blocks = Blocks::kDense, s.block_q = 96, s.block_k = 80, s.causal = true;
  s.bias = true, s.bias_dims = {1, 0, 0}, s.bias_dtype = DType::kBFloat16;
  s.lens_q = {200, 64, 333}, s.lens_k = {250, 64, 129};
  cs.push_back(s);
  s = cuda_spec("decode_1_row_gqa_lists");  // the decode shape (<= 16 rows), no GQA folding
  s.blocks = Blocks::kLists, s.block_q = 1, s.block_k = 64, s.mask_density = 0.6, s.bias = true;
  s.lens_q = {1, 1, 1}, s.lens_k = {1000, 1000, 1000}, s.heads = 8, s.heads_k = 2;
  cs.push_back(s);
  s = cuda_spec("decode_12_rows_dense_causal");
  s.blocks = Blocks::kDense, s.block_q = 4, s.block_k = 100, s.causal = true, s.bias = true, s.bias_dims = {1, 1, 0};
  s.lens_q = {12, 12}, s.lens_k = {700, 700};
  cs.push_back(s);
  s = cuda_spec("split_kv_4_lists_mask");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.mask_density = 0.7, s.num_splits = 4;
  s.lens_q = {200, 200}, s.lens_k = {1500, 1500};
  cs.push_back(s);
  s = cuda_spec("head_dim_64_lists_bias");  // padded to 128 in builds without 64
  s.head_dim = s.head_dim_v = 64;
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 64, s.bias = true, s.mask_density = 0.7;
  cs.push_back(s);
  s = cuda_spec("fp16_lists_bias_fp16");
  s.dtype = DType::kFloat16, s.bias_dtype = DType::kFloat16;
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.bias = true, s.mask_density = 0.7;
  cs.push_back(s);
  // dbias summed over the heads of both GQA groups (the reduction's path), under causal lists.
  s = cuda_spec("bias_f32_head_broadcast_gqa_causal_lists");
  s.blocks = Blocks::kLists, s.block_q = 64, s.block_k = 128, s.bias = true, s.bias_dims = {0, 1, 0};
  s.causal = true, s.mask_density = 0.8, s.heads = 8, s.heads_k = 2;
  cs.push_back(s);
  // dbias for each broadcast pattern of the bias (bwd_dbias.h, DbiasPlan): summed over the query
  // rows in the CTA and stored directly, (B, H, 1, Nk), with GQA (several heads per CTA, one
  // flush each, and split query heads) and causal block lists;
  s = cuda_spec("bias_f32_rows_broadcast_gqa_causal_lists");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.bias = true, s.bias_dims = {0, 0, 1};
  s.causal = true, s.mask_density = 0.8, s.heads = 8, s.heads_k = 2;
  s.lens_q = {700, 700}, s.lens_k = {900, 900};
  cs.push_back(s);
  // summed over the rows into partials, then over the heads: a float32 key-padding bias
  // (B, 1, 1, Nk) with ragged varlen lengths and rows with no kept key;
  s = cuda_spec("varlen_key_padding_f32_sparse_rows");
  s.varlen = true, s.bias = true, s.bias_dims = {0, 1, 1}, s.mask_density = 0.02;
  s.lens_q = {333, 1, 0, 129, 64}, s.lens_k = {517, 300, 10, 0, 64};
  cs.push_back(s);
  // (1, 1, 1, Nk) under a block mask of density 0 (nothing kept: dbias 0) and of density 1;
  s = cuda_spec("bias_keys_only_density_0");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 1.0, s.bias = true, s.bias_dims = {1, 1, 1};
  cs.push_back(s);
  s = cuda_spec("bias_keys_only_density_1_window");
  s.blocks = Blocks::kDense, s.block_q = 64, s.block_k = 128, s.absent = 0.0, s.bias = true, s.bias_dims = {1, 1, 1};
  s.window_left = 200, s.window_right = 16, s.lens_q = {1000, 1000}, s.lens_k = {1100, 1100};
  cs.push_back(s);
  // (1, 1, Nq, Nk): element partials per (b, h), summed over both, under random lists.
  s = cuda_spec("bias_bf16_shared_rows_random_lists");
  s.blocks = Blocks::kLists, s.block_q = 64, s.block_k = 64, s.mask_density = 0.5, s.bias = true;
  s.bias_dims = {1, 1, 0}, s.bias_dtype = DType::kBFloat16, s.heads = 4, s.heads_k = 4;
  cs.push_back(s);
  uint32_t seed = 3800;
  for (Spec& c : cs) c.seed = seed++;
  return cs;
}

// The gradients' bytes (dq, dk, dv, dbias where given) after the last backward of b.
std::vector<std::vector<unsigned char>> gradient_bytes(Built* b) {
  std::vector<std::vector<unsigned char>> bytes;
  for (View* v : {&b->dqv, &b->dkv, &b->dvv, &b->dbiasv}) {
    if (!v->defined()) continue;
    v->arena->download();
    bytes.push_back(v->arena->bytes());
  }
  return bytes;
}

// Checks case s (forward, then the backward with `deterministic`) against the reference.
void check_case(const Spec& s, bool deterministic) {
  Built b = build(s, Backend::kCuda);
  b.deterministic = deterministic;
  const ModsRefs refs = run_and_check(Backend::kCuda, b, options(s, b), s.dtype, s.name);
  if (s.absent == 1.0 && s.blocks != Blocks::kNone) {
    for (double x : b.outv.read()) ASSERT_EQ(x, 0.0) << s.name;
    for (double x : b.lsev.read()) ASSERT_EQ(x, -std::numeric_limits<double>::infinity()) << s.name;
    if (refs.ran) {
      for (View* v : {&b.dqv, &b.dkv, &b.dvv, &b.dbiasv}) {
        if (!v->defined()) continue;
        for (double x : v->read()) ASSERT_EQ(x, 0.0) << s.name;
      }
    }
  }
  if (!refs.ran) return;
  expect_unreached_dbias_zero(b, refs, s.name);
  if (deterministic) {  // a second backward gives the same bits
    const auto first = gradient_bytes(&b);
    ASSERT_TRUE(backward(case_backward_args(b, options(s, b))).ok()) << s.name;
    EXPECT_TRUE(gradient_bytes(&b) == first) << s.name << ": deterministic gradients differ between runs";
  }
}

class SparseCuda : public testing::TestWithParam<size_t> {};

TEST_P(SparseCuda, MatchesReference) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Spec s = cases()[GetParam()];
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "dtype or head dim not in this build";
  check_case(s, false);
}

// The deterministic backward: dQ from bwd_dq_kernel, with the same bias, masks and skipped
// tiles; bitwise repeatable (dbias included, as in every mode).
TEST_P(SparseCuda, DeterministicMatchesReference) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Spec s = cases()[GetParam()];
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "dtype or head dim not in this build";
  check_case(s, true);
}

INSTANTIATE_TEST_SUITE_P(All, SparseCuda, testing::Range<size_t>(0, cases().size()),
                         [](const testing::TestParamInfo<size_t>& p) { return cases()[p.param].name; });

// The CUDA forward against the CPU backend on the same bf16 inputs (the CPU is exact up to its
// final rounding, so it stands in for the reference): the same rows have no visible key (LSE
// -inf on both), and the outputs meet the criterion with the naive low-precision yardstick.
TEST(SparseCudaDifferential, MatchesCpuBackend) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  for (const size_t index : {size_t(1), size_t(4), size_t(12)}) {
    const Spec s = cases()[index];
    if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
    Built gpu = build(s, Backend::kCuda), cpu = build(s, Backend::kCpu);
    ASSERT_TRUE(forward(case_forward_args(gpu, options(s, gpu))).ok()) << s.name;
    ASSERT_TRUE(forward(case_forward_args(cpu, options(s, cpu))).ok()) << s.name;
    for (Built* x : {&gpu, &cpu}) {
      x->outv.arena->download();
      x->lsev.arena->download();
    }
    const std::vector<double> lse_gpu = gpu.lsev.read(), lse_cpu = cpu.lsev.read();
    for (size_t e = 0; e < lse_gpu.size(); ++e) {
      ASSERT_EQ(std::isinf(lse_gpu[e]), std::isinf(lse_cpu[e])) << s.name << " lse " << e;
    }
    // The CPU's deviation from the reference is far below the naive one's, so the criterion
    // with the CPU's output as the reference holds whenever it holds against float64.
    const Results low = naive_lowp_forward(gpu, s.dtype);
    EXPECT_TRUE(meets_criterion("out", s.dtype, gpu.outv.read(), cpu.outv.read(), low.out)) << s.name;
  }
}

// Softcap with a bias and no dbias (with dbias: the case above and DbiasMatchesCpuBackend): dq,
// dk and dv against the reference.
TEST(SparseCudaDifferential, SoftcapBiasWithoutDbias) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  Spec s = cases()[8];
  ASSERT_EQ(s.name, "bias_f32_heads_softcap_alibi_blocks");
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
  Built b = build(s, Backend::kCuda);
  b.dbiasv = View{};
  const ModsRefs refs = run_and_check(Backend::kCuda, b, options(s, b), s.dtype, s.name);
  EXPECT_TRUE(refs.ran) << s.name;
}

// dbias on the GPU against the CPU backend's on the same bf16 inputs, for a full bias (stored
// directly), one broadcast over the batch (element partials), over the query rows (row sums
// stored directly), a varlen key-padding bias (row sums into partials) and a bias with softcap
// (softcap's factor applied after dbias, sm80/bwd_kernel.h kFactorLater): the CPU's float32
// dbias stands in for the reference at the dtype's atol.
TEST(SparseCudaDifferential, DbiasMatchesCpuBackend) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  ASSERT_EQ(cases()[8].name, "bias_f32_heads_softcap_alibi_blocks");
  for (const size_t index : {size_t(1), size_t(13), size_t(20), size_t(21), size_t(8)}) {
    const Spec s = cases()[index];
    if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
    Built gpu = build(s, Backend::kCuda), cpu = build(s, Backend::kCpu);
    for (Built* x : {&gpu, &cpu}) {
      ASSERT_TRUE(forward(case_forward_args(*x, options(s, *x))).ok()) << s.name;
      ASSERT_TRUE(backward(case_backward_args(*x, options(s, *x))).ok()) << s.name;
      x->dbiasv.arena->download();
    }
    const std::vector<double> theirs = cpu.dbiasv.read();
    EXPECT_TRUE(meets_criterion("dbias", s.dtype, gpu.dbiasv.read(), theirs, theirs, max_abs(theirs))) << s.name;
  }
}

// Split-KV gives the unsplit result up to the merge's rounding: both meet the criterion and
// their LSEs agree to float32 precision.
TEST(SparseCudaDifferential, SplitKvMatchesOneSplit) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  Spec s = cases()[16];  // split_kv_4_lists_mask
  ASSERT_EQ(s.name, "split_kv_4_lists_mask");
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
  Built split = build(s, Backend::kCuda);
  s.num_splits = 1;
  Built one = build(s, Backend::kCuda);
  for (Built* x : {&split, &one}) {
    ASSERT_TRUE(forward(case_forward_args(*x, options(s, *x))).ok());
    x->outv.arena->download();
    x->lsev.arena->download();
  }
  const Results low = naive_lowp_forward(one, s.dtype);
  EXPECT_TRUE(meets_criterion("out", s.dtype, split.outv.read(), one.outv.read(), low.out));
  EXPECT_TRUE(meets_criterion("lse", DType::kFloat32, split.lsev.read(), one.lsev.read(), {}));
}

// The pattern of the first GPU run's one failure (tests/python/test_bias.py
// test_cuda_backward_matches_float64[False-float32-7], H200, 2026-12-01): a float32 bias
// (B, H, 1, Nk) = (2, 4, 1, 53), causal, 37 x 53 rows, head dim 16 (padded to a built one), GQA,
// atomics dQ, four draws. Its dbias is summed over the query rows inside the main kernel's CTA
// (column sums in sP's padding, flush_dbias_cols) and takes no atomics in any mode, and dK and
// dV are summed in a fixed order, so besides the criterion: repeated atomics-mode backwards give
// the same dK, dV and dbias bits, and the deterministic backward (the same main kernel; dQ from
// bwd_dq_kernel) gives those bits too. A race on the row-sum slots would show here as differing
// bits; the test's failure was precision (dev/NOTES.md, branch sparse-bwd: D from the bf16 out,
// which the float32-bias yardstick lacks). The seeds' dbias errors, emulated on the host (D from
// the bf16 out, the rest exact), are 0.17-0.38 of the bound 2 u (max|dbias| + 0.3).
TEST(SparseCudaDifferential, RowSummedDbiasF32CausalRepeats) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  constexpr int kRepeats = 8;
  for (const uint32_t seed : {3900u, 3901u, 3902u, 3903u}) {
    Spec s = cuda_spec("bias_f32_rows_broadcast_causal_37x53_d16");
    s.head_dim = s.head_dim_v = 16;
    s.lens_q = {37, 37}, s.lens_k = {53, 53}, s.heads = 4, s.heads_k = 2;
    s.bias = true, s.bias_dims = {0, 0, 1}, s.bias_dtype = DType::kFloat32, s.causal = true;
    s.seed = seed;
    if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
    const std::string name = s.name + " seed " + std::to_string(seed);
    Built b = build(s, Backend::kCuda);
    b.deterministic = false;
    const ModsRefs refs = run_and_check(Backend::kCuda, b, options(s, b), s.dtype, name);
    ASSERT_TRUE(refs.ran) << name;
    // dk, dv and dbias of the last backward: their bytes, and dbias's values for the message.
    const auto kv_dbias = [&b]() {
      std::vector<std::vector<unsigned char>> bytes;
      for (View* v : {&b.dkv, &b.dvv, &b.dbiasv}) {
        v->arena->download();
        bytes.push_back(v->arena->bytes());
      }
      return bytes;
    };
    const auto first = kv_dbias();
    const std::vector<double> first_dbias = b.dbiasv.read();
    const auto max_dbias_change = [&]() {
      const std::vector<double> now = b.dbiasv.read();
      double m = 0.0;
      for (size_t e = 0; e < now.size(); ++e) m = std::max(m, std::fabs(now[e] - first_dbias[e]));
      return m;
    };
    for (int r = 0; r < kRepeats; ++r) {
      ASSERT_TRUE(backward(case_backward_args(b, options(s, b))).ok()) << name;
      EXPECT_TRUE(kv_dbias() == first) << name << ": atomics-mode backward " << r + 2
                                       << " gives other dk, dv or dbias bits (max |dbias change| "
                                       << max_dbias_change() << ")";
    }
    b.deterministic = true;
    ASSERT_TRUE(backward(case_backward_args(b, options(s, b))).ok()) << name;
    EXPECT_TRUE(kv_dbias() == first) << name << ": the deterministic backward's dk, dv or dbias bits differ from "
                                     << "the atomics mode's (max |dbias change| " << max_dbias_change() << ")";
  }
}

// Key blocks no query block keeps are never loaded: NaN in the K and V rows only they cover
// (keys 128..255, block 1 of 128-key blocks, two whole kernel tiles) reaches no output. Were
// such a tile visited and masked, P = 0 times NaN in V would make every row NaN.
TEST(SparseCudaDifferential, AbsentBlocksAreNotRead) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  Spec s = cuda_spec("absent_not_read");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.absent = 0.0, s.partial = 0.5, s.mask_density = 0.8;
  s.lens_q = {300, 300}, s.lens_k = {600, 600};
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
  Built b = build(s, Backend::kCuda);
  unlist_key_block(&b, Backend::kCuda, s, 1, 9);
  ASSERT_TRUE(forward(case_forward_args(b, options(s, b))).ok());
  b.outv.arena->download();
  for (double x : b.outv.read()) ASSERT_TRUE(std::isfinite(x));
  // The backward (both dQ paths) skips those steps too: no gradient turns NaN.
  for (const bool deterministic : {false, true}) {
    b.deterministic = deterministic;
    ASSERT_TRUE(backward(case_backward_args(b, options(s, b))).ok());
    for (View* v : {&b.dqv, &b.dkv, &b.dvv}) {
      v->arena->download();
      for (double x : v->read()) ASSERT_TRUE(std::isfinite(x)) << "deterministic " << deterministic;
    }
  }
}

// The Hopper forward with block masks (sm90/fwd_kernel.h, FwdSparseTraits): calls with a block
// mask and no attn_bias (attn_mask only as the element mask of partial blocks). On an H200 under
// FLASHATTN_CUDA_PATH=sm90 every case below runs there (auto: those the split heuristic and the
// decode shape leave to it, e.g. the first and the fifth case; sm80: none, and the comparison is
// sm80 against itself); the backward (sm90 as well where the path allows: SparseSm90Bwd below)
// recomputes from the sm90 forward's LSE.
// Cases: block sizes equal to the tile (clean tiles), larger, smaller and not dividing it (mixed
// tiles), densities 0, 1 and random with rows of no kept block, ragged lengths, varlen, GQA,
// causal and windowed, softcap and ALiBi, attn_mask in partial blocks, fp16 and head dim 64.
std::vector<Spec> sm90_cases() {
  std::vector<Spec> cs;
  // 5 query tiles x 32 planes = 160 CTAs, a full grid on an H200 (132 SMs): the split heuristic
  // keeps these two on the sm90 forward under FLASHATTN_CUDA_PATH=auto too.
  Spec s = cuda_spec("sm90_dense_128x128_random_gqa");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 0.6, s.partial = 0.0;
  s.lens_q = {600, 600}, s.lens_k = {700, 700}, s.heads = 16, s.heads_k = 4;
  cs.push_back(s);
  s = cuda_spec("sm90_lists_128x128_causal_ragged");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.causal = true;
  s.lens_q = {650, 650}, s.lens_k = {900, 900};
  cs.push_back(s);
  s = cuda_spec("sm90_lists_96x80_mixed_mask_gqa");
  s.blocks = Blocks::kLists, s.block_q = 96, s.block_k = 80, s.mask_density = 0.7;
  s.heads = 6, s.heads_k = 2, s.lens_q = {500, 500}, s.lens_k = {777, 777};
  cs.push_back(s);
  s = cuda_spec("sm90_dense_density_0");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 1.0;
  cs.push_back(s);
  s = cuda_spec("sm90_dense_density_1_causal_gqa");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 0.0, s.partial = 0.0, s.causal = true;
  s.lens_q = {600, 600}, s.lens_k = {700, 700}, s.heads = 16, s.heads_k = 1;
  cs.push_back(s);
  s = cuda_spec("sm90_dense_64x192_window");
  s.blocks = Blocks::kDense, s.block_q = 64, s.block_k = 192, s.absent = 0.4;
  s.window_left = 300, s.window_right = 50, s.lens_q = {800, 800}, s.lens_k = {1000, 1000};
  cs.push_back(s);
  s = cuda_spec("sm90_varlen_lists_causal_ragged");
  s.varlen = true, s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.causal = true, s.block_batch = true;
  s.lens_q = {37, 1, 400, 0, 129, 700}, s.lens_k = {53, 300, 260, 10, 0, 900};
  cs.push_back(s);
  s = cuda_spec("sm90_varlen_dense_100x60_mask");
  s.varlen = true, s.blocks = Blocks::kDense, s.block_q = 100, s.block_k = 60, s.mask_density = 0.5;
  s.lens_q = {200, 64, 333}, s.lens_k = {250, 64, 529};
  cs.push_back(s);
  s = cuda_spec("sm90_lists_128x64_softcap_alibi_gqa");
  s.blocks = Blocks::kLists, s.block_q = 128, s.block_k = 64, s.softcap = 5.0f, s.alibi = true;
  s.heads = 8, s.heads_k = 2, s.lens_q = {600, 600}, s.lens_k = {700, 700};
  cs.push_back(s);
  s = cuda_spec("sm90_lists_1x64_per_row_blocks");
  s.blocks = Blocks::kLists, s.block_q = 1, s.block_k = 64, s.mask_density = 0.6;
  s.lens_q = {300, 300}, s.lens_k = {500, 500};
  cs.push_back(s);
  s = cuda_spec("sm90_lists_256x256_per_batch_partial_only");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 256, s.full_list = false, s.mask_density = 0.9;
  s.block_batch = true, s.lens_q = {700, 700}, s.lens_k = {1200, 1200};
  cs.push_back(s);
  s = cuda_spec("sm90_fp16_dense_200x100_causal");
  s.dtype = DType::kFloat16, s.blocks = Blocks::kDense, s.block_q = 200, s.block_k = 100, s.causal = true;
  s.lens_q = {1000, 1000}, s.lens_k = {1000, 1000};
  cs.push_back(s);
  s = cuda_spec("sm90_head_dim_64_dense_32x48");  // padded to a built head dim where 64 is not
  s.head_dim = s.head_dim_v = 64;
  s.blocks = Blocks::kDense, s.block_q = 32, s.block_k = 48, s.absent = 0.5;
  cs.push_back(s);
  uint32_t seed = 4800;
  for (Spec& c : cs) c.seed = seed++;
  return cs;
}

class SparseSm90 : public testing::TestWithParam<size_t> {};

// Forward and backward (sm90 where the path allows) against the reference; density 0 gives O 0
// and LSE -inf (and zero gradients), as on sm80.
TEST_P(SparseSm90, MatchesReference) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Spec s = sm90_cases()[GetParam()];
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "dtype or head dim not in this build";
  check_case(s, false);
}

// The same inputs through the sm90 forward and then the sm80 one (detail::Switch::kFwdSm80) in
// one process: the same rows have no visible key (LSE -inf on both), the outputs and LSEs agree
// within the criterion with the naive low-precision yardstick, and the backward (the same one for
// both) from either forward's out and LSE gives gradients that agree the same way.
TEST_P(SparseSm90, MatchesSm80Forward) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Spec s = sm90_cases()[GetParam()];
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "dtype or head dim not in this build";
  Built sm90 = build(s, Backend::kCuda), sm80 = build(s, Backend::kCuda);
  for (Built* x : {&sm90, &sm80}) {
    ScopedSwitch path(detail::Switch::kFwdSm80, x == &sm80);
    ASSERT_TRUE(forward(case_forward_args(*x, options(s, *x))).ok()) << s.name;
    ASSERT_TRUE(backward(case_backward_args(*x, options(s, *x))).ok()) << s.name;
    for (View* v : {&x->outv, &x->lsev, &x->dqv, &x->dkv, &x->dvv}) v->arena->download();
  }
  // LSE in the reference's (heads, total_q) layout, as naive_lowp_forward gives it.
  const auto lse_of = [&](const Built& x) {
    return x.lsev.ndim == 2 ? x.lsev.read()
                            : lse_ref_layout(x.lsev.read(), x.shape.batch, x.shape.heads, static_cast<int>(x.lsev.shape[2]));
  };
  const std::vector<double> lse90 = lse_of(sm90), lse80 = lse_of(sm80);
  ASSERT_EQ(lse90.size(), lse80.size());
  for (size_t e = 0; e < lse90.size(); ++e) {
    ASSERT_EQ(std::isinf(lse90[e]), std::isinf(lse80[e])) << s.name << " lse " << e;
  }
  const Results low = naive_lowp_forward(sm80, s.dtype, true);
  EXPECT_TRUE(meets_criterion("out", s.dtype, sm90.outv.read(), sm80.outv.read(), low.out)) << s.name;
  EXPECT_TRUE(meets_criterion("lse", s.dtype, lse90, lse80, low.lse)) << s.name;
  const std::vector<double> dq80 = sm80.dqv.read(), dk80 = sm80.dkv.read(), dv80 = sm80.dvv.read();
  const double mag = std::max({max_abs(dq80), max_abs(dk80), max_abs(dv80)});
  EXPECT_TRUE(meets_criterion("dq", s.dtype, sm90.dqv.read(), dq80, low.dq, mag)) << s.name;
  EXPECT_TRUE(meets_criterion("dk", s.dtype, sm90.dkv.read(), dk80, low.dk, mag)) << s.name;
  EXPECT_TRUE(meets_criterion("dv", s.dtype, sm90.dvv.read(), dv80, low.dv, mag)) << s.name;
  if (s.absent == 1.0) {
    for (double x : sm90.outv.read()) ASSERT_EQ(x, 0.0) << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(All, SparseSm90, testing::Range<size_t>(0, sm90_cases().size()),
                         [](const testing::TestParamInfo<size_t>& p) { return sm90_cases()[p.param].name; });

// The Hopper backward with block masks (sm90/bwd_kernel.h, BwdSparseTraits; no attn_bias,
// softcap, ALiBi or dropout): its dK/dV kernel walks per key tile of 128 keys (64 at d192/d256)
// the kept query tiles of 64 rows, its dQ kernel (deterministic mode; always at d192/d256) per
// query tile of 128 rows the kept key tiles of 64 keys (32 at d256). Cases: block sizes equal to those tiles or multiples (clean tiles), not
// dividing them (mixed tiles) and with attn_mask (mask tiles); densities 0, 1 and random with a
// query block row that keeps nothing (zero gradients there); causal with seqlen_q < seqlen_k
// (key tiles whose first kept query tile is deep in their list: the binary search), sliding
// windows, GQA and MQA, query heads split over CTAs (several heads per CTA, each with its own
// list), varlen with empty sequences, fp16, d64.
std::vector<Spec> sm90_bwd_cases() {
  std::vector<Spec> cs;
  Spec s = cuda_spec("sm90bwd_dense_128x128_random_gqa");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 0.6, s.partial = 0.0;
  s.lens_q = {600, 600}, s.lens_k = {700, 700}, s.heads = 16, s.heads_k = 4;
  cs.push_back(s);
  s = cuda_spec("sm90bwd_lists_128x128_causal_ragged");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.causal = true;
  s.lens_q = {650, 650}, s.lens_k = {900, 900};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_lists_64x64_causal_short_queries");  // seqlen_q < seqlen_k
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 64, s.causal = true, s.absent = 0.2;
  s.lens_q = {300, 300}, s.lens_k = {1100, 1100};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_lists_96x80_mixed_mask_gqa");
  s.blocks = Blocks::kLists, s.block_q = 96, s.block_k = 80, s.mask_density = 0.7;
  s.heads = 6, s.heads_k = 2, s.lens_q = {500, 500}, s.lens_k = {777, 777};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_dense_density_0");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 1.0;
  cs.push_back(s);
  s = cuda_spec("sm90bwd_dense_density_1_causal_mqa");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128, s.absent = 0.0, s.partial = 0.0, s.causal = true;
  s.lens_q = {600, 600}, s.lens_k = {700, 700}, s.heads = 16, s.heads_k = 1;
  cs.push_back(s);
  s = cuda_spec("sm90bwd_dense_64x192_window");
  s.blocks = Blocks::kDense, s.block_q = 64, s.block_k = 192, s.absent = 0.4;
  s.window_left = 300, s.window_right = 50, s.lens_q = {800, 800}, s.lens_k = {1000, 1000};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_lists_128x256_narrow_window_mask");
  s.blocks = Blocks::kLists, s.block_q = 128, s.block_k = 256, s.mask_density = 0.8;
  s.window_left = 64, s.window_right = 0, s.lens_q = {700, 700}, s.lens_k = {700, 700};
  cs.push_back(s);
  // 20 key tiles x 1 kv head x 2 sequences = 40 CTAs: the query heads are split 4 ways (2 heads
  // per CTA, each walking its own list: block_heads).
  s = cuda_spec("sm90bwd_lists_128x128_split_heads_mqa");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.absent = 0.5;
  s.heads = 8, s.heads_k = 1, s.lens_q = {300, 300}, s.lens_k = {2560, 2560};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_varlen_lists_causal_ragged");
  s.varlen = true, s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.causal = true, s.block_batch = true;
  s.lens_q = {37, 1, 400, 0, 129, 700}, s.lens_k = {53, 300, 260, 10, 0, 900};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_varlen_dense_100x60_mask");
  s.varlen = true, s.blocks = Blocks::kDense, s.block_q = 100, s.block_k = 60, s.mask_density = 0.5;
  s.lens_q = {200, 64, 333}, s.lens_k = {250, 64, 529};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_lists_1x64_per_row_blocks");
  s.blocks = Blocks::kLists, s.block_q = 1, s.block_k = 64, s.mask_density = 0.6;
  s.lens_q = {300, 300}, s.lens_k = {500, 500};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_lists_256x256_per_batch_partial_only");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 256, s.full_list = false, s.mask_density = 0.9;
  s.block_batch = true, s.lens_q = {700, 700}, s.lens_k = {1200, 1200};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_fp16_dense_200x100_causal");
  s.dtype = DType::kFloat16, s.blocks = Blocks::kDense, s.block_q = 200, s.block_k = 100, s.causal = true;
  s.lens_q = {1000, 1000}, s.lens_k = {1000, 1000};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_head_dim_64_dense_32x48");  // padded to a built head dim where 64 is not
  s.head_dim = s.head_dim_v = 64;
  s.blocks = Blocks::kDense, s.block_q = 32, s.block_k = 48, s.absent = 0.5;
  cs.push_back(s);
  s = cuda_spec("sm90bwd_head_dim_256_lists_96x80_mask_causal");  // split roles (skipped where not built)
  s.head_dim = s.head_dim_v = 256;
  s.blocks = Blocks::kLists, s.block_q = 96, s.block_k = 80, s.mask_density = 0.7, s.causal = true;
  s.lens_q = {400, 400}, s.lens_k = {600, 600};
  cs.push_back(s);
  s = cuda_spec("sm90bwd_head_dim_64_lists_64x64_causal_gqa");
  s.head_dim = s.head_dim_v = 64;
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 64, s.causal = true, s.mask_density = 0.7;
  s.heads = 8, s.heads_k = 2, s.lens_q = {900, 900}, s.lens_k = {1300, 1300};
  cs.push_back(s);
  uint32_t seed = 5800;
  for (Spec& c : cs) c.seed = seed++;
  return cs;
}

// Whether this process's backward of a block-mask call without attn_bias, softcap, ALiBi or
// dropout runs on the sm90 kernels: a Hopper GPU, a build with them, and FLASHATTN_CUDA_PATH not
// sm80 (scripts/gpu-check.sh runs the tests under each path; auto and sm90 both take such calls).
bool sm90_sparse_backward_here() {
#if defined(FLASHATTN_WITH_CUDA) && defined(FLASHATTN_TEST_CUDA_SM90)
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  const char* path = std::getenv("FLASHATTN_CUDA_PATH");
  return major == 9 && !(path != nullptr && std::string(path) == "sm80") &&
         !detail::switch_on(detail::Switch::kBwdSm80);
#else
  return false;
#endif
}

class SparseSm90Bwd : public testing::TestWithParam<size_t> {};

// Forward, then the backward in both dQ modes (fused with f32 dQ added by the copy engine;
// deterministic two-kernel form, bitwise repeated) against the reference; density 0 gives zero
// gradients. On a Hopper GPU (path auto or sm90) every backward must have run on sm90.
TEST_P(SparseSm90Bwd, MatchesReference) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Spec s = sm90_bwd_cases()[GetParam()];
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "dtype or head dim not in this build";
  const unsigned long long before = detail::sm90_backward_calls();
  check_case(s, false);
  const unsigned long long fused = detail::sm90_backward_calls();
  check_case(s, true);
  if (sm90_sparse_backward_here()) {
    EXPECT_GE(fused - before, 1u) << s.name << ": the backward did not run on the sm90 kernels";
    EXPECT_GE(detail::sm90_backward_calls() - fused, 2u)
        << s.name << ": the deterministic backward did not run on sm90";
  }
}

// The same inputs and forward, then the sm90 backward and the sm80 one (detail::Switch::kBwdSm80)
// in one process, each in both dQ modes: the gradients agree within the criterion with the
// naive low-precision yardstick (the sm80 ones as the reference), and rows with no kept key get
// zero dq from both.
TEST_P(SparseSm90Bwd, MatchesSm80Backward) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Spec s = sm90_bwd_cases()[GetParam()];
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "dtype or head dim not in this build";
  for (const bool deterministic : {false, true}) {
    Built b = build(s, Backend::kCuda);
    b.deterministic = deterministic;
    ASSERT_TRUE(forward(case_forward_args(b, options(s, b))).ok()) << s.name;
    std::vector<double> grads[2][3];
    for (const bool sm80 : {false, true}) {
      ScopedSwitch path(detail::Switch::kBwdSm80, sm80);
      ASSERT_TRUE(backward(case_backward_args(b, options(s, b))).ok()) << s.name;
      View* views[3] = {&b.dqv, &b.dkv, &b.dvv};
      for (int g = 0; g < 3; ++g) {
        views[g]->arena->download();
        grads[sm80][g] = views[g]->read();
      }
    }
    const Results low = naive_lowp_forward(b, s.dtype, true);
    const double mag = std::max({max_abs(grads[1][0]), max_abs(grads[1][1]), max_abs(grads[1][2])});
    const std::string name = s.name + (deterministic ? " (deterministic)" : "");
    EXPECT_TRUE(meets_criterion("dq", s.dtype, grads[0][0], grads[1][0], low.dq, mag)) << name;
    EXPECT_TRUE(meets_criterion("dk", s.dtype, grads[0][1], grads[1][1], low.dk, mag)) << name;
    EXPECT_TRUE(meets_criterion("dv", s.dtype, grads[0][2], grads[1][2], low.dv, mag)) << name;
    if (s.absent == 1.0) {
      for (int g = 0; g < 3; ++g) {
        for (double x : grads[0][g]) ASSERT_EQ(x, 0.0) << name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SparseSm90Bwd, testing::Range<size_t>(0, sm90_bwd_cases().size()),
                         [](const testing::TestParamInfo<size_t>& p) { return sm90_bwd_cases()[p.param].name; });

// Query tiles no key block keeps are never loaded by the backward either (the sm90 dK/dV kernel
// walks only listed query tiles, its dQ kernel has no step for them): NaN in q and dout rows of a
// query block that keeps nothing (rows 128..255 of 128-row blocks, whole 64-row tiles) reaches
// no gradient, and those rows' dq is 0, in both dQ modes.
TEST(SparseSm90BwdDispatch, AbsentQueryRowsAreNotRead) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  Spec s = cuda_spec("absent_query_rows_not_read");
  s.blocks = Blocks::kLists, s.block_q = s.block_k = 128, s.absent = 0.0, s.partial = 0.5, s.mask_density = 0.8;
  s.lens_q = {600, 600}, s.lens_k = {700, 700}, s.seed = 5990;
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not in this build";
  Built b = build(s, Backend::kCuda);
  unlist_query_block(&b, Backend::kCuda, s, 1, 17);
  ASSERT_TRUE(forward(case_forward_args(b, options(s, b))).ok());
  for (const bool deterministic : {false, true}) {
    b.deterministic = deterministic;
    ASSERT_TRUE(backward(case_backward_args(b, options(s, b))).ok());
    for (View* v : {&b.dqv, &b.dkv, &b.dvv}) {
      v->arena->download();
      for (double x : v->read()) ASSERT_TRUE(std::isfinite(x)) << "deterministic " << deterministic;
    }
    const std::vector<double> dq = b.dqv.read();  // logical (batch, seqlen_q, heads, head_dim)
    const int64_t row_elems = b.dqv.shape[2] * b.dqv.shape[3];
    for (int64_t bb = 0; bb < b.dqv.shape[0]; ++bb) {
      for (int64_t i = 128; i < 256; ++i) {
        for (int64_t x = 0; x < row_elems; ++x) {
          ASSERT_EQ(dq[static_cast<size_t>((bb * b.dqv.shape[1] + i) * row_elems + x)], 0.0)
              << "deterministic " << deterministic << " row " << i;
        }
      }
    }
  }
}

// The dispatcher: on a Hopper GPU (path auto or sm90) a backward with a block mask (dense or
// lists, with or without attn_mask) runs on the sm90 kernels; one with attn_bias, softcap or
// dropout besides does not (sm80), and FLASHATTN_DEV_BWD_SM80 keeps every call on sm80.
TEST(SparseSm90BwdDispatch, BlockMasksRunOnSm90) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  if (!sm90_sparse_backward_here()) GTEST_SKIP() << "not a Hopper GPU, or no sm90 kernels, or FLASHATTN_CUDA_PATH=sm80";
  struct Expect {
    Spec spec;
    bool sm90;
  };
  Spec s = cuda_spec("dispatch_dense_blocks");
  s.blocks = Blocks::kDense, s.block_q = s.block_k = 128;
  std::vector<Expect> es = {{s, true}};
  s = cuda_spec("dispatch_lists_with_mask");
  s.blocks = Blocks::kLists, s.block_q = 96, s.block_k = 80, s.mask_density = 0.7;
  es.push_back({s, true});
  s.name = "dispatch_lists_with_bias", s.mask_density = -1.0, s.bias = true;
  es.push_back({s, false});
  s.name = "dispatch_lists_with_softcap", s.bias = false, s.softcap = 5.0f;
  es.push_back({s, false});
  s.name = "dispatch_lists_with_dropout", s.softcap = 0.0f, s.dropout_p = 0.1f;
  es.push_back({s, false});
  uint32_t seed = 5900;
  for (Expect& e : es) {
    e.spec.seed = seed++;
    if (cuda_not_built(e.spec.dtype, e.spec.head_dim, e.spec.head_dim_v)) GTEST_SKIP() << "not in this build";
    Built b = build(e.spec, Backend::kCuda);
    ASSERT_TRUE(forward(case_forward_args(b, options(e.spec, b))).ok()) << e.spec.name;
    const unsigned long long before = detail::sm90_backward_calls();
    ASSERT_TRUE(backward(case_backward_args(b, options(e.spec, b))).ok()) << e.spec.name;
    EXPECT_EQ(detail::sm90_backward_calls() - before, e.sm90 ? 1u : 0u) << e.spec.name;
    if (e.sm90) {
      ScopedSwitch sm80(detail::Switch::kBwdSm80, true);
      const unsigned long long at = detail::sm90_backward_calls();
      ASSERT_TRUE(backward(case_backward_args(b, options(e.spec, b))).ok()) << e.spec.name;
      EXPECT_EQ(detail::sm90_backward_calls(), at) << e.spec.name << ": kBwdSm80 did not keep the backward on sm80";
    }
  }
}


// Softcap and ALiBi on the Hopper backward (BwdModsTraits: d64 with either mask mode, d128 without
// a window; sm90/bwd_dispatch.cu has_mods_kernel): both dQ modes against the reference (check_case:
// the deterministic one repeated bitwise), and the calls it takes ran on sm90 while d128 with a
// causal mask stays on sm80. Shares this binary for the sm90 backward count.
TEST(SparseSm90BwdDispatch, SoftcapAlibiRunOnSm90WhereTaken) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  struct Expect {
    Spec spec;
    bool sm90;
  };
  std::vector<Expect> es;
  Spec s = cuda_spec("mods_d128_softcap_gqa");
  s.softcap = 5.0f, s.heads = 8, s.heads_k = 2, s.lens_q = {333, 333}, s.lens_k = {700, 700};
  es.push_back({s, true});
  s = cuda_spec("mods_d128_softcap_alibi_short_keys");
  s.softcap = 2.0f, s.alibi = true, s.lens_q = {500, 500}, s.lens_k = {129, 129};
  es.push_back({s, true});
  s = cuda_spec("mods_d64_alibi_causal_gqa");  // padded to a built head dim where 64 is not
  s.head_dim = s.head_dim_v = 64, s.alibi = true, s.causal = true, s.heads = 6, s.heads_k = 2;
  es.push_back({s, true});
  s = cuda_spec("mods_d64_softcap_alibi_window");
  s.head_dim = s.head_dim_v = 64, s.softcap = 5.0f, s.alibi = true, s.window_left = 100, s.window_right = 20;
  es.push_back({s, true});
  s = cuda_spec("mods_d128_softcap_causal_on_sm80");
  s.softcap = 5.0f, s.causal = true;
  es.push_back({s, false});
  uint32_t seed = 5950;
  for (Expect& e : es) {
    e.spec.seed = seed++;
    if (cuda_not_built(e.spec.dtype, e.spec.head_dim, e.spec.head_dim_v)) continue;
    const unsigned long long before = detail::sm90_backward_calls();
    check_case(e.spec, false);
    check_case(e.spec, true);
    if (sm90_sparse_backward_here()) {
      // The head dim the call runs at (padded up where its own is not built) decides too.
      const int run_dim = cuda_run_head_dim(e.spec.head_dim, e.spec.head_dim_v);
      const bool windowed = e.spec.causal || e.spec.window_left >= 0 || e.spec.window_right >= 0;
      const bool sm90 = e.sm90 && (run_dim == 64 || (run_dim == 128 && !windowed));
      if (sm90) {
        EXPECT_GE(detail::sm90_backward_calls() - before, 3u) << e.spec.name << ": not all backwards ran on sm90";
      } else {
        EXPECT_EQ(detail::sm90_backward_calls(), before) << e.spec.name << ": a backward ran on sm90";
      }
    }
  }
}

}  // namespace
}  // namespace flashattn::test
