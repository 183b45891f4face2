// ThreadRingGroup: ranks simulated by threads of one process, one mailbox per rank.
//
// send_recv posts the rank's transfer list in its own mailbox and returns. wait() of rank r
// takes the post of rank r - 1 when it appears, copies every send buffer into r's receive
// buffers and marks the post consumed, then waits until rank r + 1 has consumed r's own post,
// after which r may reuse its send buffers. Posting never blocks, so no rank waits for another
// that is itself blocked in a post: the ring cannot deadlock. A rank cannot post its (k+1)-th
// exchange before its k-th was consumed (its wait() ensures it), so each mailbox holds at most
// one post and rank r's k-th wait always takes rank r - 1's k-th post.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "flashattn/ring.h"

namespace flashattn {

struct ThreadRingGroup::State {
  struct Mailbox {
    std::vector<RingTransfer> sends;  // the posted exchange
    bool posted = false;              // waiting for rank + 1 to take it
    bool copying = false;             // rank + 1 is copying from the send buffers now
    std::vector<RingTransfer> recvs;  // this rank's own receive side of its exchange
    bool in_exchange = false;         // send_recv called, wait not yet returned
  };

  explicit State(int32_t world) : mailboxes(static_cast<size_t>(world)) {}

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Mailbox> mailboxes;
  bool aborted = false;
  Status abort_status;
};

namespace {

class ThreadRingTransport final : public RingTransport {
 public:
  ThreadRingTransport(ThreadRingGroup::State* state, int32_t rank, int32_t world)
      : state_(state), rank_(rank), world_(world) {}

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_; }

  Status check_device(const Device& device) const override {
    if (device.type != DeviceType::kCPU) {
      return Status::NotSupported(
          "ThreadRingGroup exchanges host memory only; tensors on a CUDA device need the NCCL "
          "transport (make_nccl_ring_transport)");
    }
    return Status::Ok();
  }

  Status send_recv(const RingTransfer* transfers, int32_t count, void* /*stream*/) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->aborted) return state_->abort_status;
    auto& box = state_->mailboxes[static_cast<size_t>(rank_)];
    if (box.in_exchange) {
      return Status::Internal("ring transport: rank " + std::to_string(rank_) +
                              " started an exchange before waiting for the previous one");
    }
    box.sends.assign(transfers, transfers + count);
    box.recvs.assign(transfers, transfers + count);
    box.posted = true;
    box.in_exchange = true;
    state_->changed.notify_all();
    return Status::Ok();
  }

  Status wait(void* /*stream*/) override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    auto& mine = state_->mailboxes[static_cast<size_t>(rank_)];
    if (!mine.in_exchange) {
      return Status::Internal("ring transport: rank " + std::to_string(rank_) +
                              " waited without an exchange in flight");
    }
    const size_t prev = static_cast<size_t>((rank_ + world_ - 1) % world_);
    auto& theirs = state_->mailboxes[prev];
    state_->changed.wait(lock, [&] { return state_->aborted || theirs.posted; });
    if (state_->aborted) return state_->abort_status;

    if (theirs.sends.size() != mine.recvs.size()) {
      return fail_locked("ring transport: rank " + std::to_string(prev) + " sent " +
                         std::to_string(theirs.sends.size()) + " buffers, rank " +
                         std::to_string(rank_) + " expects " + std::to_string(mine.recvs.size()));
    }
    for (size_t i = 0; i < mine.recvs.size(); ++i) {
      if (theirs.sends[i].send_bytes != mine.recvs[i].recv_bytes) {
        return fail_locked(
            "ring transport: buffer " + std::to_string(i) + " from rank " + std::to_string(prev) +
            " has " + std::to_string(theirs.sends[i].send_bytes) + " bytes, rank " +
            std::to_string(rank_) + " expects " + std::to_string(mine.recvs[i].recv_bytes));
      }
    }
    // The sender keeps its buffers until `posted` is cleared, and an aborting sender until
    // `copying` is: copy without the lock.
    const std::vector<RingTransfer> sends = theirs.sends;
    theirs.copying = true;
    lock.unlock();
    for (size_t i = 0; i < sends.size(); ++i) {
      if (sends[i].send_bytes > 0) {
        std::memcpy(mine.recvs[i].recv, sends[i].send, sends[i].send_bytes);
      }
    }
    lock.lock();
    theirs.copying = false;
    theirs.posted = false;
    state_->changed.notify_all();

    // Our own post must have been taken before our send buffers may change.
    state_->changed.wait(lock, [&] { return state_->aborted || !mine.posted; });
    if (state_->aborted) return state_->abort_status;
    mine.in_exchange = false;
    return Status::Ok();
  }

  // Returns once no peer reads this rank's send buffers any more, so that the caller may free
  // them.
  void abort(const Status& why) override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    abort_locked(why);
    const auto& mine = state_->mailboxes[static_cast<size_t>(rank_)];
    state_->changed.wait(lock, [&] { return !mine.copying; });
  }

 private:
  void abort_locked(const Status& why) {
    if (state_->aborted) return;
    state_->aborted = true;
    state_->abort_status =
        Status(why.code(), "ring rank " + std::to_string(rank_) + " stopped: " + why.message());
    state_->changed.notify_all();
  }

  Status fail_locked(std::string message) {
    abort_locked(Status::Internal(std::move(message)));
    return state_->abort_status;
  }

  ThreadRingGroup::State* state_;
  int32_t rank_;
  int32_t world_;
};

}  // namespace

ThreadRingGroup::ThreadRingGroup(int32_t world_size)
    : state_(std::make_unique<State>(world_size < 1 ? 1 : world_size)) {
  const int32_t world = static_cast<int32_t>(state_->mailboxes.size());
  for (int32_t r = 0; r < world; ++r) {
    transports_.push_back(std::make_unique<ThreadRingTransport>(state_.get(), r, world));
  }
}

ThreadRingGroup::~ThreadRingGroup() = default;

int32_t ThreadRingGroup::world_size() const { return static_cast<int32_t>(transports_.size()); }

RingTransport* ThreadRingGroup::transport(int32_t rank) const {
  if (rank < 0 || rank >= world_size()) return nullptr;
  return transports_[static_cast<size_t>(rank)].get();
}

}  // namespace flashattn
