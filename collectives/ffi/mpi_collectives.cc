// All-gather and reduce-scatter between MPI processes as XLA FFI handlers (CPU buffers),
// and the C functions Python calls to initialise MPI and create the channels.
//
// Pattern: direct all-to-all inside one channel (see mpi_common.h). Every rank posts
// MPI_Irecv_c from and MPI_Isend_c to every peer at once, tagged per call site, copies its
// own block locally and waits for all (with a timeout) on a worker thread of its own, while
// the handler returns a future to XLA (see Workers below). Blocks are the rows of the leading
// dimension: all-gather sends its whole input to each peer; reduce-scatter sends input
// block j to rank j and sums the received blocks in rank order.
#include <condition_variable>
#include <deque>
#include <functional>

#include "mpi_common.h"

namespace jaxsmp {
namespace {

float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// out[i] = sum over r of blocks[r][i], accumulating in Acc, in rank order.
template <typename T, typename Acc = T>
void SumBlocks(const char* blocks, int size, size_t n, char* out) {
  const T* b = reinterpret_cast<const T*>(blocks);
  T* o = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) {
    Acc acc = static_cast<Acc>(b[i]);
    for (int r = 1; r < size; ++r) acc += static_cast<Acc>(b[r * n + i]);
    o[i] = static_cast<T>(acc);
  }
}

void SumBf16(const char* blocks, int size, size_t n, char* out) {
  const uint16_t* b = reinterpret_cast<const uint16_t*>(blocks);
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) {
    float acc = Bf16ToFloat(b[i]);
    for (int r = 1; r < size; ++r) acc += Bf16ToFloat(b[r * n + i]);
    o[i] = FloatToBf16(acc);
  }
}

ffi::Error Unsupported(ffi::DataType type) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "ffi reduce-scatter: unsupported element type " +
                        std::to_string(static_cast<int>(type)));
}

}  // namespace

ffi::Error Sum(ffi::DataType type, const char* blocks, int size, size_t n, char* out) {
  switch (type) {
    case ffi::DataType::F32: SumBlocks<float>(blocks, size, n, out); break;
    case ffi::DataType::F64: SumBlocks<double>(blocks, size, n, out); break;
    case ffi::DataType::F16: SumBlocks<_Float16, float>(blocks, size, n, out); break;
    case ffi::DataType::BF16: SumBf16(blocks, size, n, out); break;
    case ffi::DataType::S8: SumBlocks<int8_t>(blocks, size, n, out); break;
    case ffi::DataType::S16: SumBlocks<int16_t>(blocks, size, n, out); break;
    case ffi::DataType::S32: SumBlocks<int32_t>(blocks, size, n, out); break;
    case ffi::DataType::S64: SumBlocks<int64_t>(blocks, size, n, out); break;
    case ffi::DataType::U8: SumBlocks<uint8_t>(blocks, size, n, out); break;
    case ffi::DataType::U16: SumBlocks<uint16_t>(blocks, size, n, out); break;
    case ffi::DataType::U32: SumBlocks<uint32_t>(blocks, size, n, out); break;
    case ffi::DataType::U64: SumBlocks<uint64_t>(blocks, size, n, out); break;
    default: return Unsupported(type);
  }
  return ffi::Error::Success();
}


namespace {

void HostCopy(char* dst, const char* src, size_t bytes) { std::memcpy(dst, src, bytes); }

// Threads that wait for MPI so that XLA's threads do not: XLA:CPU runs independent thunks in
// whatever order its (small) thread pool reaches them, so a handler that blocked could hold
// the thread another process's peer needs for one of XLA's own collectives first. Every
// queued task has a waiting worker of its own (one is started when none is free), so no
// task ever waits behind another.
class Workers {
 public:
  void Submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    if (waiting_ >= tasks_.size()) {
      ready_.notify_one();
    } else {
      std::thread([this] { Loop(); }).detach();
    }
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++waiting_;
      ready_.wait(lock, [this] { return !tasks_.empty(); });
      --waiting_;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  size_t waiting_ = 0;
};

Workers& workers() {
  static Workers* w = new Workers();  // never destroyed: detached threads use it
  return *w;
}

// Run `exchange` (returning ffi::Error) on a worker; the future completes with its result.
template <typename F>
ffi::Future Async(F exchange) {
  ffi::Promise promise;
  ffi::Future future(promise);
  workers().Submit([promise, exchange = std::move(exchange)]() mutable {
    ffi::Error e = exchange();
    if (e.failure()) {
      promise.SetError(std::move(e));
    } else {
      promise.SetAvailable();
    }
  });
  return future;
}

ffi::Future Failed(ffi::Error e) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(std::move(e));
  return future;
}

ffi::Future AllGatherImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                          ffi::Result<ffi::AnyBuffer> out, int64_t tag, int64_t timeout_ms,
                          std::string_view site) {
  Call call{"all_gather", std::string(site), tag, timeout_ms};
  const Channel* channel;
  int rank, size;
  if (auto e = Resolve(where.typed_data(), call, &channel, &rank, &size); e.failure()) {
    return Failed(std::move(e));
  }
  size_t block = x.size_bytes();
  if (auto e = CheckSizes(call, block, out->size_bytes(), size); e.failure()) {
    return Failed(std::move(e));
  }
  const char* send = static_cast<const char*>(x.untyped_data());
  char* recv = static_cast<char*>(out->untyped_data());
  return Async([=] {
    return Exchange(call, *channel, rank, size, [&](int) { return send; }, block, recv,
                    HostCopy);
  });
}

ffi::Future ReduceScatterImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                              ffi::Result<ffi::AnyBuffer> out, int64_t tag, int64_t timeout_ms,
                              std::string_view site) {
  Call call{"reduce_scatter", std::string(site), tag, timeout_ms};
  const Channel* channel;
  int rank, size;
  if (auto e = Resolve(where.typed_data(), call, &channel, &rank, &size); e.failure()) {
    return Failed(std::move(e));
  }
  size_t block = out->size_bytes();
  if (auto e = CheckSizes(call, block, x.size_bytes(), size); e.failure()) {
    return Failed(std::move(e));
  }
  const char* send = static_cast<const char*>(x.untyped_data());
  char* result = static_cast<char*>(out->untyped_data());
  ffi::DataType type = x.element_type();
  size_t count = out->element_count();
  return Async([=] {
    std::vector<char> received(block * size);
    if (auto e = Exchange(call, *channel, rank, size, [&](int j) { return send + j * block; },
                          block, received.data(), HostCopy);
        e.failure()) {
      return e;
    }
    return Sum(type, received.data(), size, count, result);
  });
}

}  // namespace
}  // namespace jaxsmp

#define JAXSMP_BIND                       \
  ::xla::ffi::Ffi::Bind()                 \
      .Arg<::xla::ffi::AnyBuffer>()       \
      .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>() \
      .Ret<::xla::ffi::AnyBuffer>()       \
      .Attr<int64_t>("tag")               \
      .Attr<int64_t>("timeout_ms")        \
      .Attr<std::string_view>("site")

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsmpMpiAllGather, jaxsmp::AllGatherImpl, JAXSMP_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsmpMpiReduceScatter, jaxsmp::ReduceScatterImpl, JAXSMP_BIND);

extern "C" {

// Initialise MPI (thread-multiple) once; returns 0 on success.
int jaxsmp_mpi_init() {
  using namespace jaxsmp;
  std::lock_guard<std::mutex> lock(g_mutex);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 1;
    if (provided < MPI_THREAD_MULTIPLE) return 2;
  }
  if (g_world == MPI_COMM_NULL && MPI_Comm_dup(MPI_COMM_WORLD, &g_world) != MPI_SUCCESS) return 3;
  if (g_split_parent == MPI_COMM_NULL &&
      MPI_Comm_dup(MPI_COMM_WORLD, &g_split_parent) != MPI_SUCCESS) {
    return 3;
  }
  // errors come back to the handlers (and into XLA's error), not MPI's abort
  MPI_Comm_set_errhandler(g_world, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(g_split_parent, MPI_ERRORS_RETURN);
  return 0;
}

int jaxsmp_mpi_rank() {
  int r = -1;
  if (jaxsmp::g_world != MPI_COMM_NULL) MPI_Comm_rank(jaxsmp::g_world, &r);
  return r;
}

int jaxsmp_mpi_size() {
  int s = -1;
  if (jaxsmp::g_world != MPI_COMM_NULL) MPI_Comm_size(jaxsmp::g_world, &s);
  return s;
}

int jaxsmp_mpi_tag_ub() {
  int* value = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
  return flag ? *value : 32767;
}

// One round of channel creation, collective over the world: this process joins channel
// ``id`` at rank order ``key`` (id < 0: no channel this round). Returns 0 on success.
int jaxsmp_mpi_split(int32_t id, int key) {
  using namespace jaxsmp;
  MPI_Comm channel_comm;
  if (MPI_Comm_split(g_split_parent, id < 0 ? MPI_UNDEFINED : id, key, &channel_comm) !=
      MPI_SUCCESS) {
    return 1;
  }
  if (id < 0) return 0;
  Channel channel;
  channel.comm = channel_comm;
  int size;
  MPI_Comm_size(channel_comm, &size);
  MPI_Group group, world;
  MPI_Comm_group(channel_comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  channel.world_ranks.resize(size);
  MPI_Group_translate_ranks(group, size, ranks.data(), world, channel.world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_channels.count(id)) return 2;
  g_channels[id] = channel;
  return 0;
}

// Broadcast nbytes at buf from world rank root (e.g. the JAX coordinator's address).
int jaxsmp_mpi_bcast(void* buf, int nbytes, int root) {
  return MPI_Bcast(buf, nbytes, MPI_BYTE, root, jaxsmp::g_split_parent) == MPI_SUCCESS ? 0 : 1;
}

int jaxsmp_mpi_barrier() {
  return MPI_Barrier(jaxsmp::g_split_parent) == MPI_SUCCESS ? 0 : 1;
}

void jaxsmp_mpi_finalize() {
  using namespace jaxsmp;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& [id, channel] : g_channels) MPI_Comm_free(&channel.comm);
  g_channels.clear();
  if (g_world != MPI_COMM_NULL) MPI_Comm_free(&g_world);
  if (g_split_parent != MPI_COMM_NULL) MPI_Comm_free(&g_split_parent);
  MPI_Finalize();
}

}  // extern "C"
