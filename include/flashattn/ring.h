// flashattn ring attention (context parallelism): exact attention over a sequence sharded
// across ranks, each rank keeping its query shard while the K/V shards travel around a ring
// (Ring Attention, Liu et al., 2023). Per step a rank calls flashattn::forward / backward on
// its queries against the K/V shard it holds and merges the partial results with the
// log-sum-exp merge, so the result equals one call on the whole sequence (up to rounding).
//
// Every rank calls ring_forward (and later ring_backward) with its own shard, at the same
// time, with the same options. Communication goes through a RingTransport: NCCL for CUDA
// tensors (make_nccl_ring_transport), or threads of one process for CPU tensors
// (ThreadRingGroup; used by the tests, useful to try the layer without a cluster).
// Design, schedule derivation and status: docs/RING.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "flashattn/flashattn.h"
#include "flashattn/types.h"

namespace flashattn {

// How the global sequence is cut into shards.
enum class RingLayout : int32_t {
  kAuto = -1,       // zig-zag when causal, contiguous otherwise
  kContiguous = 0,  // world_size chunks, rank r holds chunk r
  kZigZag = 1,      // 2 * world_size chunks, rank r holds chunks r and 2*world_size-1-r
                    // (concatenated in that order): equal causal work on every rank
};

// The global rows [begin[i], end[i]) that make up a rank's shard, in local order.
// Chunk c of C covers [c*N/C, (c+1)*N/C) (integer division), so shards differ by at most one
// row per chunk when C does not divide N.
struct RingShard {
  int32_t num_spans = 0;  // 1 (contiguous) or 2 (zig-zag)
  int64_t begin[2] = {0, 0};
  int64_t end[2] = {0, 0};
  int64_t length = 0;  // local seqlen: sum of the spans
};

// The shard of `rank` for a global sequence of `global_seqlen` tokens. kInvalidArgument when
// the world size or rank is out of range or a chunk would be empty (global_seqlen must be at
// least the number of chunks).
Status ring_shard(int64_t global_seqlen, int32_t world_size, int32_t rank, bool causal,
                  RingLayout layout, RingShard* shard);

// ---- transport --------------------------------------------------------------------------------

// One buffer sent to rank + 1 and one received from rank - 1 (mod world_size) in an exchange.
// The peer's send_bytes must equal our recv_bytes.
struct RingTransfer {
  const void* send = nullptr;
  size_t send_bytes = 0;
  void* recv = nullptr;
  size_t recv_bytes = 0;
};

// Moves buffers one step around the ring. All ranks make the same sequence of exchanges.
class RingTransport {
 public:
  virtual ~RingTransport() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;
  // Ok when buffers on `device` can be exchanged, kNotSupported (naming the device) otherwise.
  virtual Status check_device(const Device& device) const = 0;
  // Starts one exchange of `count` transfers and returns without waiting for it. The send
  // buffers must stay unchanged and the receive buffers unread until wait(). With CUDA buffers
  // the exchange starts after the work already queued on `stream` (a cudaStream_t).
  virtual Status send_recv(const RingTransfer* transfers, int32_t count, void* stream) = 0;
  // Completes the exchange started last: afterwards (for CUDA: for work queued on `stream`
  // afterwards) the received data may be read and the sent buffers reused.
  virtual Status wait(void* stream) = 0;
  // Called by a rank that stops with an error, possibly with an exchange in flight, before
  // it frees its buffers. ThreadRingGroup: peers' calls return `why` (prefixed with the rank)
  // instead of waiting forever, and abort returns once no peer reads this rank's buffers.
  // NCCL: NCCL cannot be interrupted without destroying the caller's communicator, so peers
  // may wait; an exchange in flight is ordered before later work on its stream.
  virtual void abort(const Status& why) = 0;
};

// Ranks simulated by threads of one process, for CPU tensors: rank r's send is copied by rank
// r + 1 inside its wait(). Each rank's transport must be used by one thread at a time; the
// group must outlive the calls. After an abort the group stays failed. A world_size below 1 is
// taken as 1.
class ThreadRingGroup {
 public:
  explicit ThreadRingGroup(int32_t world_size);
  ~ThreadRingGroup();
  ThreadRingGroup(const ThreadRingGroup&) = delete;
  ThreadRingGroup& operator=(const ThreadRingGroup&) = delete;

  int32_t world_size() const;
  // The transport of `rank` (0 <= rank < world_size), owned by the group.
  RingTransport* transport(int32_t rank) const;

  struct State;  // shared mailboxes (src/ring/thread_transport.cpp)

 private:
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<RingTransport>> transports_;
};

// Whether this build contains the NCCL transport (NCCL found at configure time, CUDA on).
bool ring_nccl_built();

// A transport over an initialised NCCL communicator (`nccl_comm` is an ncclComm_t; not owned,
// it must outlive the transport) whose ranks are the ring's ranks, for tensors on CUDA device
// `device`. Exchanges run as grouped ncclSend/ncclRecv on a stream of the transport's own,
// ordered after the caller's stream with events, so the next shard's transfer overlaps the
// compute on the current one. kNotSupported when the build has no NCCL.
// Compiled, but never run in this project so far (no multi-GPU machine): see docs/RING.md.
Status make_nccl_ring_transport(void* nccl_comm, int32_t device,
                                std::unique_ptr<RingTransport>* transport);

// One process driving `count` GPUs (one thread per GPU): NCCL communicators over `devices`
// (ncclCommInitAll), rank r on devices[r], and a transport for each, which owns its
// communicator. kNotSupported when the build has no NCCL. Untested so far, like the above.
Status make_nccl_ring_group(const int32_t* devices, int32_t count,
                            std::vector<std::unique_ptr<RingTransport>>* transports);

// ---- ring attention ---------------------------------------------------------------------------

// Options of the ring; rank and world size come from the transport.
struct RingOptions {
  RingTransport* transport = nullptr;  // required
  // Tokens of the whole sequence; 0 = world_size * the local seqlen (equal shards). Needed
  // when the chunks are unequal (the local seqlen of each rank is then given by ring_shard).
  int64_t global_seqlen = 0;
  RingLayout layout = RingLayout::kAuto;
};

// Local shards (dense layout; seqlen = this rank's shard length from ring_shard):
//   q (batch, seqlen, heads, head_dim), k (batch, seqlen, heads_k, head_dim),
//   v (batch, seqlen, heads_k, head_dim_v), out (batch, seqlen, heads, head_dim_v),
//   lse float32 (batch, heads, seqlen), optional (the backward needs it).
// Of the AttentionOptions, softmax_scale, causal, softcap, window_left / window_right (a sliding
// window over the global sequence), learnable_sink, stream and num_threads apply (and num_splits
// of ForwardArgs, deterministic and dsink of BackwardArgs: each rank's dsink is its own rows'
// share, to be summed over the ranks). Dropout, ALiBi and varlen are kNotSupported: the dropout
// mask is indexed by the global row and column and ALiBi by the global distance, which the
// per-step calls would need as offsets; varlen is not plumbed through the ring yet. Future work
// (docs/RING.md).
// All ranks must pass the same global_seqlen, layout, causal flag, window, sink and shapes (not
// checkable without communicating; the thread transport reports size mismatches, NCCL cannot).
struct RingForwardArgs : ForwardArgs, RingOptions {};

// Local shards as in RingForwardArgs; out and lse are what ring_forward returned for this
// shard (the global output and log-sum-exp), dout like out; dq, dk, dv like q, k, v.
struct RingBackwardArgs : BackwardArgs, RingOptions {};

Status ring_forward(const RingForwardArgs& args);
Status ring_backward(const RingBackwardArgs& args);

}  // namespace flashattn
