// Builds BlockTilePlan (block_tiles.h): the table of block states from either form of the block
// mask, then per (plane, query tile) the list of key tiles to visit with their kind.
#include "cuda/block_tiles.h"

#include <string>

#include "cuda/common/cuda_check.h"

namespace flashattn::cuda {
namespace {

constexpr int kThreads = 256;

size_t align16(size_t x) { return (x + 15) / 16 * 16; }

// The plan's geometry: planes (one per sequence / head only where the mask differs between
// them), the user's blocks and the kernel's tiles over the longest sequences.
struct Geometry {
  int64_t planes_b, planes_h, q_blocks, k_blocks, m_tiles, n_tiles;
  __host__ __device__ int64_t planes() const { return planes_b * planes_h; }
  __host__ __device__ size_t states_bytes() const { return size_t(planes() * q_blocks * k_blocks); }
  size_t lists_bytes() const { return size_t(planes() * m_tiles * (n_tiles + 1)) * sizeof(int32_t); }
};

Geometry geometry(const QKVParams& p, int block_m, int block_n) {
  Geometry g;
  const bool by_batch = p.block_mask.defined() ? p.block_mask.size[0] > 1 : p.block_lists_vary_over_batch();
  const bool by_head = p.block_mask.defined() ? p.block_mask.size[1] > 1 : p.block_lists_vary_over_heads();
  g.planes_b = by_batch ? p.batch : 1;
  g.planes_h = by_head ? p.heads : 1;
  g.q_blocks = (int64_t(p.seqlen_q) + p.block_size_q - 1) / p.block_size_q;
  g.k_blocks = (int64_t(p.seqlen_k) + p.block_size_k - 1) / p.block_size_k;
  g.m_tiles = (p.seqlen_q + block_m - 1) / block_m;
  g.n_tiles = (p.seqlen_k + block_n - 1) / block_n;
  return g;
}

// The state tables are written a warp per row (plane, query block r), grid-stride, the lanes over
// the row's key blocks (or list entries): one set of 64-bit divisions per row rather than per
// entry, which had made the element-per-thread form ~4 us for a 16 x 128 x 128 table on the H200
// (dev/NOTES.md, "the plan's kernels"). Rows of fewer than 32 blocks leave lanes idle: such a
// table is small.
__device__ __forceinline__ void table_row(int64_t row, const Geometry& g, int64_t* b, int64_t* h, int64_t* r) {
  *r = row % g.q_blocks;
  const int64_t plane = row / g.q_blocks;
  *b = plane / g.planes_h;
  *h = plane % g.planes_h;
}

// Dense block_mask: a kept block is partial (attn_mask applies to it; without attn_mask it is
// visible everywhere, like a full one).
__global__ void states_from_dense(uint8_t* states, const Broadcast4 m, Geometry g) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < g.planes() * g.q_blocks; w += warps) {
    int64_t b, h, r;
    table_row(w, g, &b, &h, &r);
    const auto* keep = static_cast<const uint8_t*>(m.data) + b * m.batch + h * m.head + r * m.row;
    uint8_t* row = states + w * g.k_blocks;
    for (int64_t c = lane; c < g.k_blocks; c += 32) row[c] = keep[c] != 0 ? kBlockPartial : kBlockAbsent;
  }
}

// One list of the compressed form: every listed block of (plane, query block r) gets `state`.
// Device values are not checked on the host (SEMANTICS.md): an index outside the key blocks is
// ignored here, so no write leaves the table.
__global__ void states_from_list(uint8_t* states, const BlockList l, uint8_t state, Geometry g) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; w < g.planes() * g.q_blocks; w += warps) {
    int64_t b, h, r;
    table_row(w, g, &b, &h, &r);
    const int64_t count = l.count_at(b, h, r);
    const int32_t* listed = l.row_at(b, h, r);
    uint8_t* row = states + w * g.k_blocks;
    for (int64_t e = lane; e < count && e < l.width; e += 32) {
      const int32_t c = listed[e];
      if (c >= 0 && c < g.k_blocks) row[c] = state;
    }
  }
}

// The list of one tile of one plane (`table` its block states), by one warp. Query-major (the
// forward's): for query tile `tile`, lane l classifies key tile n_tiles - 1 - (base + l) from the
// states of the user blocks the two tiles' rectangle touches; key-major (the Hopper backward's
// dK/dV kernel): the axes swapped, key tile `tile` against query tile m_tiles - 1 - (base + l).
// The warp appends the kept tiles in descending order (ballot + prefix count), so the list is
// sorted as the kernel walks it.
__device__ void list_one(int32_t* list, const uint8_t* table, const Geometry& g, int64_t tile, bool key_major,
                         int block_m, int block_n, int bq, int bk, int seqlen_q, int seqlen_k, bool has_mask,
                         int lane) {
  int64_t f0, f1;  // the listed tile's blocks on its own axis
  if (key_major) {
    tile_blocks(tile, block_n, bk, seqlen_k, &f0, &f1);
  } else {
    tile_blocks(tile, block_m, bq, seqlen_q, &f0, &f1);
  }
  const int64_t walked = key_major ? g.m_tiles : g.n_tiles;
  // kRounds rounds of 32 tiles classified before their ballots, so that their table reads are in
  // flight together (one dependent L2 round trip per kRounds x 32 tiles, not per 32).
  constexpr int kRounds = 4;
  int32_t count = 0;
  for (int64_t base = 0; base < walked; base += 32 * kRounds) {
    int32_t kind[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      const int64_t t = walked - 1 - (base + 32 * u + lane);
      kind[u] = kTileSkipped;
      if (t >= 0) {
        int64_t w0, w1;
        if (key_major) {
          tile_blocks(t, block_m, bq, seqlen_q, &w0, &w1);
          kind[u] = tile_kind(table, g.k_blocks, w0, w1, f0, f1, has_mask);
        } else {
          tile_blocks(t, block_n, bk, seqlen_k, &w0, &w1);
          kind[u] = tile_kind(table, g.k_blocks, f0, f1, w0, w1, has_mask);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      const int64_t t = walked - 1 - (base + 32 * u + lane);
      const bool kept = kind[u] != kTileSkipped;
      const unsigned ballot = __ballot_sync(0xffffffffu, kept);
      if (kept) list[1 + count + __popc(ballot & ((1u << lane) - 1))] = int32_t(t) | (kind[u] << kTileKindShift);
      count += __popc(ballot);
    }
  }
  if (lane == 0) list[0] = count;
}

// One warp per (plane, listed tile), grid-stride: query tiles (m_tiles lists of n_tiles + 1 words
// per plane) or, key_major, key tiles (n_tiles lists of m_tiles + 1).
__global__ void tile_lists(int32_t* lists, const uint8_t* states, Geometry g, bool key_major, int block_m,
                           int block_n, int bq, int bk, int seqlen_q, int seqlen_k, bool has_mask) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t listed = key_major ? g.n_tiles : g.m_tiles;
  const int64_t walked = key_major ? g.m_tiles : g.n_tiles;
  for (int64_t item = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; item < g.planes() * listed;
       item += warps) {  // item = plane * listed + tile; uniform across the warp
    list_one(lists + item * (walked + 1), states + item / listed * g.q_blocks * g.k_blocks, g, item % listed,
             key_major, block_m, block_n, bq, bk, seqlen_q, seqlen_k, has_mask, lane);
  }
}

// The backward's tables: one thread per (plane, query tile, key tile), grid-stride.
__global__ void tile_kinds_kernel(int8_t* kinds, const uint8_t* states, Geometry g, int block_m, int block_n,
                                  int bq, int bk, int seqlen_q, int seqlen_k, bool has_mask) {
  const int64_t n = g.planes() * g.m_tiles * g.n_tiles;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t nt = e % g.n_tiles, m = e / g.n_tiles % g.m_tiles, plane = e / (g.n_tiles * g.m_tiles);
    int64_t r0, r1, c0, c1;
    tile_blocks(m, block_m, bq, seqlen_q, &r0, &r1);
    tile_blocks(nt, block_n, bk, seqlen_k, &c0, &c1);
    kinds[e] = int8_t(tile_kind(states + plane * g.q_blocks * g.k_blocks, g.k_blocks, r0, r1, c0, c1, has_mask));
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// The table of block states from either form of the block mask (the plan's first part).
Status fill_states(const QKVParams& p, const Geometry& g, uint8_t* states, cudaStream_t stream) {
  if (p.block_mask.defined()) {
    states_from_dense<<<grid_for(g.planes() * g.q_blocks * 32), kThreads, 0, stream>>>(states, p.block_mask, g);
    return Status::Ok();
  }
  FLASHATTN_CUDA_TRY(cudaMemsetAsync(states, kBlockAbsent, g.states_bytes(), stream));
  const struct {
    const BlockList& list;
    BlockState state;
  } given[2] = {{p.partial_blocks, kBlockPartial}, {p.full_blocks, kBlockFull}};
  for (const auto& l : given) {
    if (!l.list.defined() || l.list.width == 0) continue;
    states_from_list<<<grid_for(g.planes() * g.q_blocks * 32), kThreads, 0, stream>>>(states, l.list, l.state, g);
  }
  return Status::Ok();
}

void set_plan(BlockTilePlan* plan, const Geometry& g, const uint8_t* states, const int32_t* lists) {
  plan->states = states;
  plan->lists = lists;
  plan->q_blocks = int32_t(g.q_blocks);
  plan->k_blocks = int32_t(g.k_blocks);
  plan->m_tiles = int32_t(g.m_tiles);
  plan->n_tiles = int32_t(g.n_tiles);
  plan->by_batch = g.planes_b > 1;
  plan->by_head = g.planes_h > 1;
}

}  // namespace

size_t block_tiles_bytes(const ForwardParams& p, int block_m, int block_n) {
  const Geometry g = geometry(p, block_m, block_n);
  return align16(g.states_bytes()) + g.lists_bytes();
}

Status build_block_tiles(ForwardParams* p, int block_m, int block_n, void* workspace, cudaStream_t stream) {
  const Geometry g = geometry(*p, block_m, block_n);
  if (g.n_tiles > kTileIndexMask) {
    return Status::NotSupported("block_mask: seqlen_k " + std::to_string(p->seqlen_k) +
                                " has more key tiles than the CUDA block-sparse plan indexes");
  }
  auto* states = static_cast<uint8_t*>(workspace);
  auto* lists = reinterpret_cast<int32_t*>(states + align16(g.states_bytes()));
  if (Status s = fill_states(*p, g, states, stream); !s.ok()) return s;
  const int64_t warps = g.planes() * g.m_tiles;
  tile_lists<<<grid_for(warps * 32), kThreads, 0, stream>>>(lists, states, g, false, block_m, block_n,
                                                            p->block_size_q, p->block_size_k, p->seqlen_q,
                                                            p->seqlen_k, p->mask.defined());
  FLASHATTN_CUDA_TRY(cudaGetLastError());
  set_plan(&p->block_tiles, g, states, lists);
  return Status::Ok();
}

size_t block_states_bytes(const QKVParams& p) { return align16(geometry(p, 1, 1).states_bytes()); }

Status build_block_states(const QKVParams& p, void* workspace, cudaStream_t stream, BlockTilePlan* plan) {
  const Geometry g = geometry(p, 1, 1);
  auto* states = static_cast<uint8_t*>(workspace);
  if (Status s = fill_states(p, g, states, stream); !s.ok()) return s;
  FLASHATTN_CUDA_TRY(cudaGetLastError());
  set_plan(plan, g, states, nullptr);
  return Status::Ok();
}

size_t tile_kinds_bytes(const QKVParams& p, int block_m, int block_n) {
  const Geometry g = geometry(p, block_m, block_n);
  return align16(size_t(g.planes() * g.m_tiles * g.n_tiles));
}

Status build_tile_kinds(const QKVParams& p, const BlockTilePlan& plan, int block_m, int block_n, void* workspace,
                        cudaStream_t stream, TileKinds* kinds) {
  const Geometry g = geometry(p, block_m, block_n);
  auto* table = static_cast<int8_t*>(workspace);
  const int64_t n = g.planes() * g.m_tiles * g.n_tiles;
  if (n > 0) {
    tile_kinds_kernel<<<grid_for(n), kThreads, 0, stream>>>(table, plan.states, g, block_m, block_n, p.block_size_q,
                                                            p.block_size_k, p.seqlen_q, p.seqlen_k, p.mask.defined());
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  kinds->kinds = table;
  kinds->m_tiles = int32_t(g.m_tiles);
  kinds->n_tiles = int32_t(g.n_tiles);
  return Status::Ok();
}

size_t tile_lists_bytes(const QKVParams& p, int block_m, int block_n) {
  const Geometry g = geometry(p, block_m, block_n);  // either orientation: a count per list
  return align16(size_t(g.planes() * (g.m_tiles * g.n_tiles + g.m_tiles + g.n_tiles)) * sizeof(int32_t));
}

Status build_tile_lists(const QKVParams& p, const BlockTilePlan& plan, int block_m, int block_n, bool key_major,
                        void* workspace, cudaStream_t stream, const int32_t** lists) {
  const Geometry g = geometry(p, block_m, block_n);
  if (g.n_tiles > kTileIndexMask || g.m_tiles > kTileIndexMask) {
    return Status::NotSupported("block_mask: the sequences have more tiles than the CUDA block-sparse plan indexes");
  }
  auto* out = static_cast<int32_t*>(workspace);
  const int64_t warps = g.planes() * (key_major ? g.n_tiles : g.m_tiles);
  if (warps > 0) {
    tile_lists<<<grid_for(warps * 32), kThreads, 0, stream>>>(out, plan.states, g, key_major, block_m, block_n,
                                                              p.block_size_q, p.block_size_k, p.seqlen_q, p.seqlen_k,
                                                              p.mask.defined());
    FLASHATTN_CUDA_TRY(cudaGetLastError());
  }
  *lists = out;
  return Status::Ok();
}

}  // namespace flashattn::cuda
