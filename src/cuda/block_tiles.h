// Block-sparse attention on the CUDA forward: the plan (BlockTilePlan, core/params.h) that tells
// each CTA which of its key tiles to visit and how much checking each needs.
//
// Mapping between the user's blocks (bq x bk, any sizes) and the kernel's tiles (kBlockM x
// kBlockN): a kernel tile is classified by the user blocks its rectangle touches (the kernel
// never sees bq or bk except in a mixed tile):
//   no kept block          -> not listed: no load, no math;
//   only full blocks       -> kTileClean: no element check (partial blocks count as full when
//                             there is no attn_mask, so a dense block_mask lands here);
//   only partial blocks    -> kTileMask: attn_mask per element;
//   anything else          -> kTileMixed: per element, the state of its block from the table,
//                             then attn_mask where that block is partial.
// When bq and bk are multiples of the tile (FlexAttention's 128 x 128 against 128 x 32/64
// tiles, or 64 x 64 against 64 x 64) every tile lies inside one user block and is never
// mixed: the fast path is the common case. Other sizes (96 x 80) stay exact through the mixed
// tiles at their block boundaries, which pay an integer division and a byte read per score.
// Why classify on the device rather than convert the mask on the host: the masks live on the
// GPU (reading them back would synchronise and break CUDA-graph capture), and one small pass
// over the block table (one warp per query tile, one lane per key tile) is cheap next to the
// attention itself. Why not classify inside the attention kernel: finding the next kept tile
// ahead of time (the K prefetch needs it) would cost the hot loop a scan per step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/params.h"
#include "cuda/common/tile_kind.h"

namespace flashattn::cuda {

// For a call with a block mask (either form): the bytes of workspace the plan for block_m x
// block_n tiles needs.
size_t block_tiles_bytes(const ForwardParams& p, int block_m, int block_n);
// Builds the plan in `workspace` (block_tiles_bytes of it, 16-byte aligned) on `stream` and
// points p->block_tiles at it.
Status build_block_tiles(ForwardParams* p, int block_m, int block_n, void* workspace, cudaStream_t stream);

// The backward's plan (sm80/bwd_kernel.h says why it differs): the table of block states
// (plan->lists stays null; m_tiles / n_tiles are those of 1 x 1 tiles, unused), then, per
// kernel tiling of block_m x block_n, a table of tile kinds: byte (plane, m, n) is the
// tile_kind (TileKind, or kTileSkipped) of query tile m and key tile n, as the forward's lists
// classify their tiles. Sizes in bytes of workspace (16-byte aligned pieces), built on `stream`.
size_t block_states_bytes(const QKVParams& p);
Status build_block_states(const QKVParams& p, void* workspace, cudaStream_t stream, BlockTilePlan* plan);
size_t tile_kinds_bytes(const QKVParams& p, int block_m, int block_n);
Status build_tile_kinds(const QKVParams& p, const BlockTilePlan& plan, int block_m, int block_n, void* workspace,
                        cudaStream_t stream, TileKinds* kinds);

// The Hopper backward's plan (sm90/bwd_kernel.h), from the block states of build_block_states:
// lists of kept tiles for a tiling of block_m x block_n, each (count, then entries tile index |
// kind << kTileKindShift in descending tile order), walked by one producer thread per CTA.
//  - key-major: per (plane, key tile n), the query tiles of the column, at
//    lists[(plane * n_tiles + n) * (m_tiles + 1)] (the dK/dV kernel: one CTA per key tile);
//  - query-major: per (plane, query tile m), the key tiles of the row, at
//    lists[(plane * m_tiles + m) * (n_tiles + 1)], the forward's lists (the deterministic dQ
//    kernel: one CTA per query tile).
// Why lists rather than the sm80 backward's byte table: the producer must know the step after
// the current one (its load runs a stage ahead and the consumers stop at the last), and a
// column of the table is n_tiles bytes apart; a list gives both in one read per step.
size_t tile_lists_bytes(const QKVParams& p, int block_m, int block_n);
Status build_tile_lists(const QKVParams& p, const BlockTilePlan& plan, int block_m, int block_n, bool key_major,
                        void* workspace, cudaStream_t stream, const int32_t** lists);

}  // namespace flashattn::cuda
