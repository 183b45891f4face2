// ring_forward / ring_backward: the ring loop over any RingTransport (ring_attention.h).
//
// Buffers (B = batch, L = this rank's shard, Lmax = the largest shard, contiguous):
//   K/V ring:    k_buf[2] (B, Lmax, heads_k, d), v_buf[2] (B, Lmax, heads_k, dv), input dtype;
//                one is computed on while the other receives the next shard.
//   forward:     o_acc (B, L, heads, dv) f32, lse_acc (B, heads, L) f32: the running result;
//                o_part (B, L, heads, dv) dtype, lse_part (B, heads, L) f32: one call's result.
//   backward:    dq_acc (B, L, heads, d) f32, dq_part dtype;
//                dk_acc[2], dv_acc[2] (B, Lmax, heads_k, d|dv) f32: the travelling dK/dV
//                accumulators (one receives while the other is sent);
//                dk_part, dv_part (B, Lmax, heads_k, d|dv) dtype: one call's result;
//                dk_step, dv_step f32: a step's sum when it has several calls.
// The accumulators are float32 so that R steps of additions cost no more precision than one.
#include "ring/ring_attention.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/params.h"
#include "flashattn/flashattn.h"
#include "ring/ops.h"

namespace flashattn::ring {
namespace {

constexpr size_t kBufferAlign = 256;  // every workspace buffer starts 256-byte aligned

// Rows [rows.begin, rows.end) of a (batch, rows, heads, dim) view.
TensorView slice_rows(const TensorView& t, Span rows) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + rows.begin * t.strides[1] * dtype_size(t.dtype);
  s.shape[1] = rows.length();
  return s;
}

// Rows of a (batch, heads, rows) LSE view.
TensorView slice_lse(const TensorView& t, Span rows) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + rows.begin * t.strides[2] * dtype_size(t.dtype);
  s.shape[2] = rows.length();
  return s;
}

// The workspace of one call: a single allocation carved into aligned buffers, freed on exit
// (stream-ordered on CUDA, so after the queued work that uses it).
class Workspace {
 public:
  explicit Workspace(RingOps& ops) : ops_(ops) {}
  ~Workspace() { ops_.free(base_); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // Reserves a buffer; its address is valid after commit().
  size_t reserve(size_t bytes) {
    const size_t offset = size_;
    size_ += (bytes + kBufferAlign - 1) / kBufferAlign * kBufferAlign;
    return offset;
  }
  Status commit() { return ops_.alloc(size_, &base_); }
  void* at(size_t offset) const { return static_cast<char*>(base_) + offset; }

 private:
  RingOps& ops_;
  void* base_ = nullptr;
  size_t size_ = 0;
};

// Describes the tensors of the rank's problem in its device and dtype.
struct Views {
  const RingProblem& p;

  TensorView make(void* data, DType dtype, std::initializer_list<int64_t> shape) const {
    return make_contiguous_view(data, dtype, p.device, shape);
  }
  // (B, len, heads_k, dim) in `dtype`: a K, V, dK or dV shard of `len` rows.
  TensorView kv(void* data, DType dtype, int64_t len, int64_t dim) const {
    return make(data, dtype, {p.batch, len, p.heads_k, dim});
  }
  // (B, L, heads, dim): a q-like tensor of this rank.
  TensorView q(void* data, DType dtype, int64_t dim) const {
    return make(data, dtype, {p.batch, p.local_seqlen, p.heads, dim});
  }
  // (B, heads, L) float32.
  TensorView lse(void* data) const {
    return make(data, DType::kFloat32, {p.batch, p.heads, p.local_seqlen});
  }
  size_t kv_bytes(DType dtype, int64_t len, int64_t dim) const {
    return static_cast<size_t>(p.batch * len * p.heads_k * dim) * dtype_size(dtype);
  }
  size_t q_bytes(DType dtype, int64_t dim) const {
    return static_cast<size_t>(p.batch * p.local_seqlen * p.heads * dim) * dtype_size(dtype);
  }
  size_t lse_bytes() const {
    return static_cast<size_t>(p.batch * p.heads * p.local_seqlen) * sizeof(float);
  }
};

std::unique_ptr<RingOps> make_ops(const RingProblem& p, void* stream, int num_threads) {
#if defined(FLASHATTN_WITH_CUDA)
  if (p.device.type == DeviceType::kCUDA) return make_cuda_ops(p.device.index, stream);
#endif
  (void)stream;
  return make_cpu_ops(num_threads);
}

// The window and scale of one local call; the rest of the options as given.
void set_call_options(const RingProblem& p, const LocalCall& call, AttentionOptions* o) {
  o->softmax_scale = p.softmax_scale;
  o->causal = false;
  o->window_left = call.window_left;
  o->window_right = call.window_right;
}

// Which of the step's calls add the learnable sink: it is a key without a value row, so it joins
// each row's softmax in exactly one call, and the (O, LSE) merge carries it like any key (the
// LSE of the result includes it). Step 0 holds the rank's own shard, which every local row sees
// (sink_calls, schedule.h). The backward's calls with it give dsink the same rows' share.
Status step_sink_calls(const AttentionOptions& o, const RingProblem& p, int32_t step,
                       const std::vector<LocalCall>& calls, std::vector<char>* carries) {
  if (o.learnable_sink.defined() && step == 0) return sink_calls(calls, p.local_seqlen, carries);
  carries->assign(calls.size(), 0);
  return Status::Ok();
}

#define FLASHATTN_RING_TRY(expr)        \
  do {                                  \
    if (Status s_ = (expr); !s_.ok()) { \
      return s_;                        \
    }                                   \
  } while (0)

Status forward_loop(const RingForwardArgs& args, const RingProblem& p, RingOps& ops,
                    Workspace& ws) {
  const Views views{p};
  const int32_t world = p.world;
  const DType dt = p.dtype;
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const int64_t lmax = p.sharding.max_shard_length();

  size_t k_off[2], v_off[2];
  for (int i = 0; i < 2; ++i) {
    k_off[i] = ws.reserve(views.kv_bytes(dt, lmax, d));
    v_off[i] = ws.reserve(views.kv_bytes(dt, lmax, dv));
  }
  const size_t o_acc_off = ws.reserve(views.q_bytes(DType::kFloat32, dv));
  const size_t lse_acc_off = ws.reserve(views.lse_bytes());
  const size_t o_part_off = ws.reserve(views.q_bytes(dt, dv));
  const size_t lse_part_off = ws.reserve(views.lse_bytes());
  FLASHATTN_RING_TRY(ws.commit());

  const TensorView o_acc = views.q(ws.at(o_acc_off), DType::kFloat32, dv);
  const TensorView lse_acc = views.lse(ws.at(lse_acc_off));
  const TensorView o_part = views.q(ws.at(o_part_off), dt, dv);
  const TensorView lse_part = views.lse(ws.at(lse_part_off));

  const int64_t l0 = p.local_seqlen;
  FLASHATTN_RING_TRY(ops.copy(args.k, views.kv(ws.at(k_off[0]), dt, l0, d)));
  FLASHATTN_RING_TRY(ops.copy(args.v, views.kv(ws.at(v_off[0]), dt, l0, dv)));
  FLASHATTN_RING_TRY(ops.fill(o_acc, 0.0f));
  FLASHATTN_RING_TRY(ops.fill(lse_acc, -INFINITY));

  int cur = 0;
  std::vector<char> carries;  // which of the step's calls add the learnable sink
  for (int32_t step = 0; step < world; ++step) {
    const int64_t lk = p.sharding.shard_length(kv_source_rank(p.rank, step, world));
    const bool more = step + 1 < world;
    if (more) {
      // Start moving the held shard on while this step computes on it.
      const int64_t ln = p.sharding.shard_length(kv_source_rank(p.rank, step + 1, world));
      const RingTransfer transfers[2] = {{ws.at(k_off[cur]), views.kv_bytes(dt, lk, d),
                                          ws.at(k_off[1 - cur]), views.kv_bytes(dt, ln, d)},
                                         {ws.at(v_off[cur]), views.kv_bytes(dt, lk, dv),
                                          ws.at(v_off[1 - cur]), views.kv_bytes(dt, ln, dv)}};
      FLASHATTN_RING_TRY(p.transport->send_recv(transfers, 2, args.stream));
    }
    const TensorView k_held = views.kv(ws.at(k_off[cur]), dt, lk, d);
    const TensorView v_held = views.kv(ws.at(v_off[cur]), dt, lk, dv);
    const std::vector<LocalCall> calls =
        plan_step(p.sharding, p.rank, step, p.causal, p.coalesce, p.window_left, p.window_right).calls;
    FLASHATTN_RING_TRY(step_sink_calls(args, p, step, calls, &carries));
    for (size_t i = 0; i < calls.size(); ++i) {
      const LocalCall& call = calls[i];
      ForwardArgs fa;
      static_cast<AttentionOptions&>(fa) = args;
      set_call_options(p, call, &fa);
      if (!carries[i]) fa.learnable_sink = TensorView{};
      fa.num_splits = args.num_splits;
      fa.q = slice_rows(args.q, call.q_rows);
      fa.k = slice_rows(k_held, call.k_rows);
      fa.v = slice_rows(v_held, call.k_rows);
      fa.out = slice_rows(o_part, call.q_rows);
      fa.lse = slice_lse(lse_part, call.q_rows);
      FLASHATTN_RING_TRY(forward(fa));
      FLASHATTN_RING_TRY(ops.merge(slice_rows(o_acc, call.q_rows), slice_lse(lse_acc, call.q_rows),
                                   fa.out, fa.lse));
    }
    if (more) {
      FLASHATTN_RING_TRY(p.transport->wait(args.stream));
      cur = 1 - cur;
    }
  }
  FLASHATTN_RING_TRY(ops.copy(o_acc, args.out));
  if (args.lse.defined()) FLASHATTN_RING_TRY(ops.copy(lse_acc, args.lse));
  return Status::Ok();
}

Status backward_loop(const RingBackwardArgs& args, const RingProblem& p, RingOps& ops,
                     Workspace& ws) {
  const Views views{p};
  const int32_t world = p.world;
  const DType dt = p.dtype;
  const DType f32 = DType::kFloat32;
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const int64_t lmax = p.sharding.max_shard_length();
  const auto shard_len = [&](int32_t step) {
    return p.sharding.shard_length(kv_source_rank(p.rank, step, world));
  };

  size_t k_off[2], v_off[2], dk_off[2], dv_off[2];
  for (int i = 0; i < 2; ++i) {
    k_off[i] = ws.reserve(views.kv_bytes(dt, lmax, d));
    v_off[i] = ws.reserve(views.kv_bytes(dt, lmax, dv));
    dk_off[i] = ws.reserve(views.kv_bytes(f32, lmax, d));
    dv_off[i] = ws.reserve(views.kv_bytes(f32, lmax, dv));
  }
  const size_t dk_part_off = ws.reserve(views.kv_bytes(dt, lmax, d));
  const size_t dv_part_off = ws.reserve(views.kv_bytes(dt, lmax, dv));
  const size_t dk_step_off = ws.reserve(views.kv_bytes(f32, lmax, d));
  const size_t dv_step_off = ws.reserve(views.kv_bytes(f32, lmax, dv));
  const size_t dq_acc_off = ws.reserve(views.q_bytes(f32, d));
  const size_t dq_part_off = ws.reserve(views.q_bytes(dt, d));
  const bool sink_grad = args.dsink.defined();
  const size_t dsink_off[2] = {ws.reserve(sink_grad ? sizeof(float) * p.heads : 0),
                               ws.reserve(sink_grad ? sizeof(float) * p.heads : 0)};
  FLASHATTN_RING_TRY(ws.commit());

  const TensorView dq_acc = views.q(ws.at(dq_acc_off), f32, d);
  const TensorView dq_part = views.q(ws.at(dq_part_off), dt, d);
  // dsink: the sum over the sink-carrying calls (acc) of each call's (part), as (1, 1, heads).
  const TensorView dsink_acc = views.make(ws.at(dsink_off[0]), f32, {1, 1, p.heads});
  const TensorView dsink_part = views.make(ws.at(dsink_off[1]), f32, {1, 1, p.heads});
  if (sink_grad) FLASHATTN_RING_TRY(ops.fill(dsink_acc, 0.0f));
  std::vector<char> carries;

  FLASHATTN_RING_TRY(ops.copy(args.k, views.kv(ws.at(k_off[0]), dt, p.local_seqlen, d)));
  FLASHATTN_RING_TRY(ops.copy(args.v, views.kv(ws.at(v_off[0]), dt, p.local_seqlen, dv)));
  FLASHATTN_RING_TRY(ops.fill(dq_acc, 0.0f));

  int cur = 0;  // K/V buffer computed on
  for (int32_t step = 0; step < world; ++step) {
    const int64_t lk = shard_len(step);
    // The accumulator of this step's shard arrives in slot step % 2 (at step 0 it starts
    // there); the one completed at the previous step leaves from the other slot.
    const int in = step % 2, out = 1 - in;
    std::vector<RingTransfer> transfers;
    if (step + 1 < world) {
      const int64_t ln = shard_len(step + 1);
      transfers.push_back({ws.at(k_off[cur]), views.kv_bytes(dt, lk, d), ws.at(k_off[1 - cur]),
                           views.kv_bytes(dt, ln, d)});
      transfers.push_back({ws.at(v_off[cur]), views.kv_bytes(dt, lk, dv), ws.at(v_off[1 - cur]),
                           views.kv_bytes(dt, ln, dv)});
    }
    if (step > 0) {
      // Ours of the previous step goes to rank + 1; rank - 1's of its previous step (the
      // shard held now: (rank - 1) - (step - 1) = rank - step) comes in.
      const int64_t lp = shard_len(step - 1);
      transfers.push_back({ws.at(dk_off[out]), views.kv_bytes(f32, lp, d), ws.at(dk_off[in]),
                           views.kv_bytes(f32, lk, d)});
      transfers.push_back({ws.at(dv_off[out]), views.kv_bytes(f32, lp, dv), ws.at(dv_off[in]),
                           views.kv_bytes(f32, lk, dv)});
    }
    if (!transfers.empty()) {
      FLASHATTN_RING_TRY(p.transport->send_recv(
          transfers.data(), static_cast<int32_t>(transfers.size()), args.stream));
    }

    const TensorView k_held = views.kv(ws.at(k_off[cur]), dt, lk, d);
    const TensorView v_held = views.kv(ws.at(v_off[cur]), dt, lk, dv);
    const TensorView dk_part = views.kv(ws.at(dk_part_off), dt, lk, d);
    const TensorView dv_part = views.kv(ws.at(dv_part_off), dt, lk, dv);
    const TensorView dk_step = views.kv(ws.at(dk_step_off), f32, lk, d);
    const TensorView dv_step = views.kv(ws.at(dv_step_off), f32, lk, dv);
    const std::vector<LocalCall> calls =
        plan_step(p.sharding, p.rank, step, p.causal, p.coalesce, p.window_left, p.window_right).calls;
    // One call: its dK/dV are added to the accumulator straight from dk_part/dv_part after the
    // exchange. Several: they are summed in dk_step/dv_step first (their key rows may overlap).
    const bool summed = calls.size() > 1;
    if (summed) {
      FLASHATTN_RING_TRY(ops.fill(dk_step, 0.0f));
      FLASHATTN_RING_TRY(ops.fill(dv_step, 0.0f));
    }
    FLASHATTN_RING_TRY(step_sink_calls(args, p, step, calls, &carries));
    for (size_t i = 0; i < calls.size(); ++i) {
      const LocalCall& call = calls[i];
      BackwardArgs ba;
      static_cast<AttentionOptions&>(ba) = args;
      set_call_options(p, call, &ba);
      ba.deterministic = args.deterministic;
      if (!carries[i]) ba.learnable_sink = TensorView{};
      if (carries[i] && sink_grad) {
        ba.dsink = dsink_part;
        ba.dsink.ndim = 1;
        ba.dsink.shape[0] = p.heads;
        ba.dsink.strides[0] = 1;
      }
      ba.q = slice_rows(args.q, call.q_rows);
      ba.k = slice_rows(k_held, call.k_rows);
      ba.v = slice_rows(v_held, call.k_rows);
      ba.out = slice_rows(args.out, call.q_rows);
      ba.dout = slice_rows(args.dout, call.q_rows);
      ba.lse = slice_lse(args.lse, call.q_rows);
      ba.dq = slice_rows(dq_part, call.q_rows);
      ba.dk = slice_rows(dk_part, call.k_rows);
      ba.dv = slice_rows(dv_part, call.k_rows);
      FLASHATTN_RING_TRY(backward(ba));
      if (ba.dsink.defined()) FLASHATTN_RING_TRY(ops.accumulate(dsink_acc, dsink_part));
      FLASHATTN_RING_TRY(ops.accumulate(slice_rows(dq_acc, call.q_rows), ba.dq));
      if (summed) {
        FLASHATTN_RING_TRY(ops.accumulate(slice_rows(dk_step, call.k_rows), ba.dk));
        FLASHATTN_RING_TRY(ops.accumulate(slice_rows(dv_step, call.k_rows), ba.dv));
      }
    }
    if (!transfers.empty()) FLASHATTN_RING_TRY(p.transport->wait(args.stream));

    const TensorView dk_acc = views.kv(ws.at(dk_off[in]), f32, lk, d);
    const TensorView dv_acc = views.kv(ws.at(dv_off[in]), f32, lk, dv);
    if (step == 0) {  // the accumulator of our own shard starts here
      FLASHATTN_RING_TRY(ops.fill(dk_acc, 0.0f));
      FLASHATTN_RING_TRY(ops.fill(dv_acc, 0.0f));
    }
    if (summed) {
      FLASHATTN_RING_TRY(ops.accumulate(dk_acc, dk_step));
      FLASHATTN_RING_TRY(ops.accumulate(dv_acc, dv_step));
    } else if (calls.size() == 1) {
      const Span rows = calls.front().k_rows;
      FLASHATTN_RING_TRY(ops.accumulate(slice_rows(dk_acc, rows), slice_rows(dk_part, rows)));
      FLASHATTN_RING_TRY(ops.accumulate(slice_rows(dv_acc, rows), slice_rows(dv_part, rows)));
    }
    if (step + 1 < world) cur = 1 - cur;
  }

  // The last accumulator (of shard rank + 1) makes its final hop; ours comes home.
  int final_slot = (world - 1) % 2;
  if (world > 1) {
    const int send = final_slot, recv = 1 - final_slot;
    const int64_t lp = shard_len(world - 1);
    const int64_t l0 = p.local_seqlen;
    const RingTransfer transfers[2] = {{ws.at(dk_off[send]), views.kv_bytes(f32, lp, d),
                                        ws.at(dk_off[recv]), views.kv_bytes(f32, l0, d)},
                                       {ws.at(dv_off[send]), views.kv_bytes(f32, lp, dv),
                                        ws.at(dv_off[recv]), views.kv_bytes(f32, l0, dv)}};
    FLASHATTN_RING_TRY(p.transport->send_recv(transfers, 2, args.stream));
    FLASHATTN_RING_TRY(p.transport->wait(args.stream));
    final_slot = recv;
  }
  FLASHATTN_RING_TRY(ops.copy(dq_acc, args.dq));
  if (sink_grad) {
    TensorView dsink = args.dsink;  // (heads), stride 1 (validated): seen as (1, 1, heads)
    dsink.ndim = 3;
    dsink.shape[0] = dsink.shape[1] = 1;
    dsink.shape[2] = p.heads;
    dsink.strides[0] = dsink.strides[1] = p.heads;
    dsink.strides[2] = 1;
    FLASHATTN_RING_TRY(ops.copy(dsink_acc, dsink));
  }
  FLASHATTN_RING_TRY(
      ops.copy(views.kv(ws.at(dk_off[final_slot]), f32, p.local_seqlen, d), args.dk));
  FLASHATTN_RING_TRY(
      ops.copy(views.kv(ws.at(dv_off[final_slot]), f32, p.local_seqlen, dv), args.dv));
  return Status::Ok();
}

#undef FLASHATTN_RING_TRY

// Runs one pass: validation, then the loop; any failure is reported to the peers.
template <class Args, class MakeParams, class Loop>
Status run_pass(const Args& args, const RingTuning& tuning, MakeParams make_params, Loop loop) {
  if (args.transport == nullptr) {
    return Status::InvalidArgument("ring: transport is required but was not given");
  }
  RingProblem problem;
  Status s = check_ring_unsupported(args);
  if (s.ok()) s = make_params(args);
  if (s.ok()) s = make_ring_problem(args, args, args.q, args.k, args.v, &problem);
  problem.coalesce = tuning.coalesce;
  if (!s.ok()) {
    args.transport->abort(s);
    return s;
  }
  const std::unique_ptr<RingOps> ops = make_ops(problem, args.stream, args.num_threads);
  Workspace ws(*ops);
  s = loop(args, problem, *ops, ws);
  // Before the workspace goes: peers must stop waiting for us and stop reading our buffers.
  if (!s.ok()) args.transport->abort(s);
  return s;
}

}  // namespace

Status check_ring_unsupported(const AttentionOptions& o) {
  const char* why =
      " (its mask or bias depends on global positions, which the per-step calls "
      "do not know yet; docs/RING.md)";
  if (o.dropout_p != 0.0f) {
    return Status::NotSupported("ring attention: dropout_p must be 0, got " +
                                std::to_string(o.dropout_p) + why);
  }
  if (o.alibi_slopes.defined()) {
    return Status::NotSupported(std::string("ring attention: alibi_slopes is not supported") + why);
  }
  if (o.cu_seqlens_q.defined() || o.cu_seqlens_k.defined()) {
    return Status::NotSupported(
        "ring attention: varlen (cu_seqlens_q / cu_seqlens_k) is not supported; pass dense "
        "(batch, seqlen, heads, dim) shards");
  }
  return Status::Ok();
}

Status make_ring_problem(const AttentionOptions& o, const RingOptions& ring, const TensorView& q,
                         const TensorView& k, const TensorView& v, RingProblem* p) {
  RingTransport* t = ring.transport;
  p->transport = t;
  p->world = t->world_size();
  p->rank = t->rank();
  if (p->world < 1 || p->rank < 0 || p->rank >= p->world) {
    return Status::InvalidArgument("ring: the transport has rank " + std::to_string(p->rank) +
                                   " of world_size " + std::to_string(p->world));
  }
  if (Status s = t->check_device(q.device); !s.ok()) return s;
  // q, k and v passed flashattn's own checks: dense rank-4 views on one device.
  const int64_t local = q.shape[1];
  if (k.shape[1] != local) {
    return Status::InvalidArgument(
        "ring: q and k must hold the same shard of the sequence (self-attention), got q "
        "seqlen " +
        std::to_string(local) + " and k seqlen " + std::to_string(k.shape[1]));
  }
  if (ring.global_seqlen < 0) {
    return Status::InvalidArgument(
        "ring: global_seqlen must be >= 0 (0 = world_size * local "
        "seqlen), got " +
        std::to_string(ring.global_seqlen));
  }
  const int64_t global = ring.global_seqlen > 0 ? ring.global_seqlen : p->world * local;
  p->causal = o.causal;
  p->window_left = o.window_left;
  p->window_right = o.window_right;
  if (Status s =
          Sharding::make(global, p->world, resolve_layout(ring.layout, o.causal), &p->sharding);
      !s.ok()) {
    return s;
  }
  const int64_t expected = p->sharding.shard_length(p->rank);
  if (local != expected) {
    return Status::InvalidArgument(
        "ring: rank " + std::to_string(p->rank) + " must hold " + std::to_string(expected) +
        " rows of the global sequence of " + std::to_string(global) + " (" +
        (p->sharding.layout() == RingLayout::kZigZag ? "zig-zag" : "contiguous") +
        " layout, see ring_shard), got q and k with seqlen " + std::to_string(local) +
        (ring.global_seqlen == 0 ? "; set global_seqlen when the shards are unequal" : ""));
  }
  p->dtype = q.dtype;
  p->device = q.device;
  p->batch = q.shape[0];
  p->heads = q.shape[2];
  p->heads_k = k.shape[2];
  p->head_dim = q.shape[3];
  p->head_dim_v = v.shape[3];
  p->local_seqlen = local;
  p->softmax_scale = o.softmax_scale > 0.0f
                         ? o.softmax_scale
                         : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p->head_dim)));
  return Status::Ok();
}

Status ring_forward(const RingForwardArgs& args, const RingTuning& tuning) {
  return run_pass(
      args, tuning,
      [](const RingForwardArgs& a) {
        ForwardParams params;
        return make_forward_params(a, &params);
      },
      forward_loop);
}

Status ring_backward(const RingBackwardArgs& args, const RingTuning& tuning) {
  return run_pass(
      args, tuning,
      [](const RingBackwardArgs& a) {
        BackwardParams params;
        return make_backward_params(a, &params);
      },
      backward_loop);
}

}  // namespace flashattn::ring

namespace flashattn {

Status ring_shard(int64_t global_seqlen, int32_t world_size, int32_t rank, bool causal,
                  RingLayout layout, RingShard* shard) {
  ring::Sharding s;
  if (Status st =
          ring::Sharding::make(global_seqlen, world_size, ring::resolve_layout(layout, causal), &s);
      !st.ok()) {
    return st;
  }
  if (rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("ring_shard: rank must be in [0, " + std::to_string(world_size) +
                                   "), got " + std::to_string(rank));
  }
  *shard = RingShard{};
  shard->num_spans = s.chunks_per_rank();
  for (int32_t i = 0; i < s.chunks_per_rank(); ++i) {
    shard->begin[i] = s.global_span(rank, i).begin;
    shard->end[i] = s.global_span(rank, i).end;
  }
  shard->length = s.shard_length(rank);
  return Status::Ok();
}

Status ring_forward(const RingForwardArgs& args) { return ring::ring_forward(args, {}); }

Status ring_backward(const RingBackwardArgs& args) { return ring::ring_backward(args, {}); }

}  // namespace flashattn
