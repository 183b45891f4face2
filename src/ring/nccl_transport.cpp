// RingTransport over NCCL point-to-point: ncclSend to rank + 1 and ncclRecv from rank - 1,
// grouped, on a communication stream of the transport's own.
//
// UNTESTED: this file compiles in CUDA builds with NCCL (cmake/ring.cmake) but has never run:
// the project has had no machine with several GPUs. The ring logic it serves (schedule, merge,
// buffer rotation, dK/dV accumulators) is the one tested with ThreadRingGroup; only the
// transfers and their stream ordering here are unverified. docs/RING.md says how to run it.
//
// Stream ordering, for an exchange started on the caller's (compute) stream S:
//   send_recv: record `ready` on S  ->  the comm stream C waits for `ready` (the buffers to
//              send are written and the receive buffers no longer read by queued work)
//              ->  ncclGroupStart; per transfer ncclSend + ncclRecv; ncclGroupEnd on C
//              ->  record `done` on C.
//   wait:      S waits for `done` (no host blocking).
// The attention call of the current step is queued on S between send_recv and wait, so it
// runs while C moves the next shard: the transfer overlaps the compute.
#include <memory>
#include <string>
#include <vector>

#include "flashattn/ring.h"

#if defined(FLASHATTN_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include "cuda/common/cuda_check.h"
#endif

namespace flashattn {

#if defined(FLASHATTN_WITH_NCCL)
namespace {

Status cuda_error(cudaError_t e, const char* what) {
  return Status::CudaError(std::string("ring NCCL transport: ") + what + ": " +
                           cudaGetErrorString(e));
}

Status nccl_error(ncclResult_t r, const char* what) {
  return Status::CudaError(std::string("ring NCCL transport: ") + what + ": " +
                           ncclGetErrorString(r));
}

class NcclRingTransport final : public RingTransport {
 public:
  NcclRingTransport(ncclComm_t comm, bool owns_comm, int device, int rank, int world)
      : comm_(comm), owns_comm_(owns_comm), device_(device), rank_(rank), world_(world) {}

  ~NcclRingTransport() override {
    cuda::DeviceScope scope(device_);
    if (done_ != nullptr) (void)cudaEventDestroy(done_);
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (owns_comm_) (void)ncclCommDestroy(comm_);
  }

  Status init() {
    cuda::DeviceScope scope(device_);
    if (scope.status() != cudaSuccess) return cuda_error(scope.status(), "selecting the device");
    // A high-priority stream so that the small transfer kernels of NCCL get scheduled between
    // the attention kernel's blocks rather than after them.
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e != cudaSuccess) return cuda_error(e, "querying stream priorities");
    e = cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest);
    if (e != cudaSuccess) return cuda_error(e, "creating the communication stream");
    e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_error(e, "creating an event");
    e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    if (e != cudaSuccess) return cuda_error(e, "creating an event");
    return Status::Ok();
  }

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_; }

  Status check_device(const Device& device) const override {
    if (device.type != DeviceType::kCUDA || device.index != device_) {
      return Status::NotSupported(
          "the NCCL ring transport was made for cuda:" + std::to_string(device_) +
          " but the tensors are on " +
          (device.type == DeviceType::kCPU ? std::string("cpu")
                                           : "cuda:" + std::to_string(device.index)));
    }
    return Status::Ok();
  }

  Status send_recv(const RingTransfer* transfers, int32_t count, void* stream) override {
    if (in_exchange_) {
      return Status::Internal("ring NCCL transport: exchange started before waiting for the last");
    }
    cuda::DeviceScope scope(device_);
    if (scope.status() != cudaSuccess) return cuda_error(scope.status(), "selecting the device");
    const auto compute = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaEventRecord(ready_, compute);
    if (e != cudaSuccess) return cuda_error(e, "recording the ready event");
    e = cudaStreamWaitEvent(stream_, ready_, 0);
    if (e != cudaSuccess) return cuda_error(e, "ordering the comm stream after the compute");
    const int next = (rank_ + 1) % world_;
    const int prev = (rank_ + world_ - 1) % world_;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_error(r, "ncclGroupStart");
    for (int32_t i = 0; i < count; ++i) {
      r = ncclSend(transfers[i].send, transfers[i].send_bytes, ncclUint8, next, comm_, stream_);
      if (r != ncclSuccess) break;
      r = ncclRecv(transfers[i].recv, transfers[i].recv_bytes, ncclUint8, prev, comm_, stream_);
      if (r != ncclSuccess) break;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_error(r, "ncclSend/ncclRecv");
    if (end != ncclSuccess) return nccl_error(end, "ncclGroupEnd");
    e = cudaEventRecord(done_, stream_);
    if (e != cudaSuccess) return cuda_error(e, "recording the done event");
    in_exchange_ = true;
    compute_ = compute;
    return Status::Ok();
  }

  Status wait(void* stream) override {
    if (!in_exchange_) {
      return Status::Internal("ring NCCL transport: wait without an exchange in flight");
    }
    in_exchange_ = false;
    cuda::DeviceScope scope(device_);
    if (scope.status() != cudaSuccess) return cuda_error(scope.status(), "selecting the device");
    const cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_, 0);
    if (e != cudaSuccess) return cuda_error(e, "ordering the compute after the exchange");
    return Status::Ok();
  }

  // NCCL operations cannot be interrupted from here without destroying the caller's
  // communicator (ncclCommAbort), which is the caller's to decide. What abort does: with an
  // exchange in flight, order the compute stream after it, so that the ring's workspace (freed
  // stream-ordered on that stream) is not reused while NCCL may still read or write it.
  void abort(const Status& /*why*/) override {
    if (!in_exchange_) return;
    in_exchange_ = false;
    cuda::DeviceScope scope(device_);
    (void)cudaStreamWaitEvent(compute_, done_, 0);
  }

 private:
  ncclComm_t comm_;
  bool owns_comm_;
  int device_;
  int rank_;
  int world_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool in_exchange_ = false;
  cudaStream_t compute_ = nullptr;  // the caller's stream of the exchange in flight
};

}  // namespace

bool ring_nccl_built() { return true; }

Status make_nccl_ring_transport(void* nccl_comm, int32_t device,
                                std::unique_ptr<RingTransport>* transport) {
  if (nccl_comm == nullptr) {
    return Status::InvalidArgument("make_nccl_ring_transport: nccl_comm is null");
  }
  if (transport == nullptr) {
    return Status::InvalidArgument("make_nccl_ring_transport: transport (the output) is null");
  }
  const auto comm = static_cast<ncclComm_t>(nccl_comm);
  int rank = 0, world = 0;
  ncclResult_t r = ncclCommUserRank(comm, &rank);
  if (r != ncclSuccess) return nccl_error(r, "ncclCommUserRank");
  r = ncclCommCount(comm, &world);
  if (r != ncclSuccess) return nccl_error(r, "ncclCommCount");
  int comm_device = -1;
  r = ncclCommCuDevice(comm, &comm_device);
  if (r != ncclSuccess) return nccl_error(r, "ncclCommCuDevice");
  if (comm_device != device) {
    return Status::InvalidArgument(
        "make_nccl_ring_transport: the communicator is on cuda:" + std::to_string(comm_device) +
        ", device is " + std::to_string(device));
  }
  auto t = std::make_unique<NcclRingTransport>(comm, /*owns_comm=*/false, device, rank, world);
  if (Status s = t->init(); !s.ok()) return s;
  *transport = std::move(t);
  return Status::Ok();
}

Status make_nccl_ring_group(const int32_t* devices, int32_t count,
                            std::vector<std::unique_ptr<RingTransport>>* transports) {
  if (devices == nullptr || count < 1 || transports == nullptr) {
    return Status::InvalidArgument(
        "make_nccl_ring_group: devices (non-null, count >= 1) and transports are required, got "
        "count " +
        std::to_string(count));
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(count), nullptr);
  std::vector<int> devs(devices, devices + count);
  const ncclResult_t r = ncclCommInitAll(comms.data(), count, devs.data());
  if (r != ncclSuccess) return nccl_error(r, "ncclCommInitAll");
  std::vector<std::unique_ptr<RingTransport>> made;
  Status status;
  for (int32_t i = 0; i < count; ++i) {
    // Owned from here on: a failure below destroys the communicators made so far.
    auto t = std::make_unique<NcclRingTransport>(comms[static_cast<size_t>(i)],
                                                 /*owns_comm=*/true, devs[static_cast<size_t>(i)],
                                                 i, count);
    if (status.ok()) status = t->init();
    made.push_back(std::move(t));
  }
  if (!status.ok()) return status;
  *transports = std::move(made);
  return Status::Ok();
}

#else  // no NCCL in this build

bool ring_nccl_built() { return false; }

namespace {
Status no_nccl(const char* function) {
  return Status::NotSupported(std::string(function) +
                              ": this flashattn build has no NCCL transport (it needs the CUDA "
                              "backend and NCCL at configure time; see cmake/ring.cmake)");
}
}  // namespace

Status make_nccl_ring_transport(void* /*nccl_comm*/, int32_t /*device*/,
                                std::unique_ptr<RingTransport>* /*transport*/) {
  return no_nccl("make_nccl_ring_transport");
}

Status make_nccl_ring_group(const int32_t* /*devices*/, int32_t /*count*/,
                            std::vector<std::unique_ptr<RingTransport>>* /*transports*/) {
  return no_nccl("make_nccl_ring_group");
}

#endif

}  // namespace flashattn
