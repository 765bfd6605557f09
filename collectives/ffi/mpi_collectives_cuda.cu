// The CUDA handlers of the MPI collectives: same targets, same channels, same exchange as the
// CPU ones (mpi_common.h), on device buffers, run on XLA's stream.
//
// MPI that is not CUDA-aware (the default assumption): the input is copied to a pinned host
// buffer asynchronously on XLA's stream, the stream is synchronised (MPI needs the bytes
// now), MPI exchanges host buffers, and the result goes back with an asynchronous copy on
// the same stream; the pinned buffer is reused only after that copy's event has completed.
// CUDA-aware MPI (JAXSMP_MPI_CUDA_AWARE=1, or MPI says so at start): device pointers go to
// MPI directly and the reduce-scatter sums the received blocks with a kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_Query_cuda_support
#endif

#include <cstdlib>

#include "mpi_common.h"

namespace jaxsmp {
namespace {

ffi::Error CudaError(cudaError_t e, const Call& call, const char* what) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    Describe(call) + ": " + what + ": " + cudaGetErrorString(e));
}

#define JAXSMP_CUDA(expr, what)                                  \
  do {                                                           \
    cudaError_t e_ = (expr);                                     \
    if (e_ != cudaSuccess) return CudaError(e_, call, what);     \
  } while (0)

// A pinned host buffer that grows on demand; `done` marks the last asynchronous copy that
// reads or writes it, so the host waits for it before touching the buffer again.
struct Pinned {
  char* ptr = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
};

cudaError_t Reserve(Pinned& b, size_t bytes) {
  if (b.done == nullptr) {
    if (cudaError_t e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming)) return e;
  }
  if (cudaError_t e = cudaEventSynchronize(b.done)) return e;
  if (bytes <= b.capacity) return cudaSuccess;
  if (b.ptr != nullptr) cudaFreeHost(b.ptr);
  b.capacity = 0;
  if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&b.ptr), bytes,
                                    cudaHostAllocPortable)) {
    b.ptr = nullptr;
    return e;
  }
  b.capacity = bytes;
  return cudaSuccess;
}

struct Staging {  // per host thread: XLA may run several devices' handlers concurrently
  Pinned where, in, out;
};
thread_local Staging t_staging;

bool CudaAware() {
  static const bool aware = [] {
    if (const char* env = std::getenv("JAXSMP_MPI_CUDA_AWARE")) return std::string(env) == "1";
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
    int supported = 0;
    MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported);
    return supported == 1;
#else
    return false;
#endif
  }();
  return aware;
}

struct Peers {
  const Channel* channel;
  int rank, size;
};

// Before the exchange: without CUDA-aware MPI, copy x into the thread's pinned `in` buffer;
// read the channel named by the device-resident int32[2] `where`; wait for both (MPI needs
// the bytes now).
ffi::Error Prepare(cudaStream_t stream, ffi::AnyBuffer x, bool aware,
                   ffi::Buffer<ffi::S32> where, const Call& call, Peers* peers) {
  Staging& s = t_staging;
  size_t bytes = x.size_bytes();
  if (!aware) {
    JAXSMP_CUDA(Reserve(s.in, bytes), "pinned buffer");
    JAXSMP_CUDA(cudaMemcpyAsync(s.in.ptr, x.untyped_data(), bytes, cudaMemcpyDeviceToHost, stream),
                "stage in");
  }
  JAXSMP_CUDA(Reserve(s.where, 2 * sizeof(int32_t)), "pinned buffer");
  JAXSMP_CUDA(cudaMemcpyAsync(s.where.ptr, where.typed_data(), 2 * sizeof(int32_t),
                              cudaMemcpyDeviceToHost, stream),
              "copy of the channel index");
  JAXSMP_CUDA(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return Resolve(reinterpret_cast<const int32_t*>(s.where.ptr), call, &peers->channel,
                 &peers->rank, &peers->size);
}

// Places this rank's own block: on the device (CUDA-aware), or in host memory (staged).
struct DeviceCopy {
  cudaStream_t stream;
  void operator()(char* dst, const char* src, size_t n) const {
    cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream);
  }
};

void HostCopy(char* dst, const char* src, size_t n) { std::memcpy(dst, src, n); }

// After a staged exchange: `bytes` of the pinned `out` buffer (from `offset`) to the device.
ffi::Error StageOut(cudaStream_t stream, void* dst, size_t offset, size_t bytes, const Call& call) {
  Pinned& out = t_staging.out;
  JAXSMP_CUDA(cudaMemcpyAsync(dst, out.ptr + offset, bytes, cudaMemcpyHostToDevice, stream),
              "stage out");
  JAXSMP_CUDA(cudaEventRecord(out.done, stream), "cudaEventRecord");
  return ffi::Error::Success();
}

template <typename T, typename Acc>
__global__ void SumBlocksKernel(const T* blocks, int size, size_t n, T* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    Acc acc = static_cast<Acc>(blocks[i]);
    for (int r = 1; r < size; ++r) acc += static_cast<Acc>(blocks[r * n + i]);
    out[i] = static_cast<T>(acc);
  }
}

template <typename T, typename Acc = T>
void LaunchSum(cudaStream_t stream, const void* blocks, int size, size_t n, void* out) {
  unsigned grid = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 4096));
  SumBlocksKernel<T, Acc><<<grid ? grid : 1, 256, 0, stream>>>(
      static_cast<const T*>(blocks), size, n, static_cast<T*>(out));
}

ffi::Error DeviceSum(cudaStream_t stream, ffi::DataType type, const void* blocks, int size,
                     size_t n, void* out) {
  switch (type) {
    case ffi::DataType::F32: LaunchSum<float>(stream, blocks, size, n, out); break;
    case ffi::DataType::F64: LaunchSum<double>(stream, blocks, size, n, out); break;
    case ffi::DataType::F16: LaunchSum<__half, float>(stream, blocks, size, n, out); break;
    case ffi::DataType::BF16: LaunchSum<__nv_bfloat16, float>(stream, blocks, size, n, out); break;
    case ffi::DataType::S32: LaunchSum<int32_t>(stream, blocks, size, n, out); break;
    case ffi::DataType::S64: LaunchSum<int64_t>(stream, blocks, size, n, out); break;
    case ffi::DataType::U32: LaunchSum<uint32_t>(stream, blocks, size, n, out); break;
    default:
      return ffi::Error(ffi::ErrorCode::kUnimplemented,
                        "ffi reduce-scatter (CUDA-aware): unsupported element type " +
                            std::to_string(static_cast<int>(type)));
  }
  if (cudaError_t e = cudaGetLastError()) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      std::string("sum kernel: ") + cudaGetErrorString(e));
  }
  return ffi::Error::Success();
}

ffi::Error AllGatherCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> where,
                         ffi::Result<ffi::AnyBuffer> out, int64_t tag, int64_t timeout_ms,
                         std::string_view site) {
  Call call{"all_gather", std::string(site), tag, timeout_ms};
  size_t block = x.size_bytes();
  const char* src = static_cast<const char*>(x.untyped_data());
  bool aware = CudaAware();
  Peers p;
  if (auto e = Prepare(stream, x, aware, where, call, &p); e.failure()) return e;
  if (auto e = CheckSizes(call, block, out->size_bytes(), p.size); e.failure()) return e;
  char* dst = static_cast<char*>(out->untyped_data());
  if (aware) {
    return Exchange(call, *p.channel, p.rank, p.size, [&](int) { return src; }, block, dst,
                    DeviceCopy{stream});
  }
  Staging& s = t_staging;
  JAXSMP_CUDA(Reserve(s.out, block * p.size), "pinned buffer");
  const char* staged = s.in.ptr;
  if (auto e = Exchange(call, *p.channel, p.rank, p.size, [&](int) { return staged; }, block,
                        s.out.ptr, HostCopy);
      e.failure()) {
    return e;
  }
  return StageOut(stream, dst, 0, block * p.size, call);
}

ffi::Error ReduceScatterCuda(cudaStream_t stream, ffi::ScratchAllocator scratch, ffi::AnyBuffer x,
                             ffi::Buffer<ffi::S32> where, ffi::Result<ffi::AnyBuffer> out,
                             int64_t tag, int64_t timeout_ms, std::string_view site) {
  Call call{"reduce_scatter", std::string(site), tag, timeout_ms};
  size_t total = x.size_bytes();
  const char* src = static_cast<const char*>(x.untyped_data());
  bool aware = CudaAware();
  Peers p;
  if (auto e = Prepare(stream, x, aware, where, call, &p); e.failure()) return e;
  size_t block = out->size_bytes();
  if (auto e = CheckSizes(call, block, total, p.size); e.failure()) return e;
  if (aware) {  // received blocks in device scratch, summed by a kernel on XLA's stream
    auto buffer = scratch.Allocate(total, 256);
    if (!buffer) {
      return ffi::Error(ffi::ErrorCode::kResourceExhausted, "scratch for received blocks");
    }
    char* received = static_cast<char*>(*buffer);
    if (auto e = Exchange(call, *p.channel, p.rank, p.size,
                          [&](int j) { return src + j * block; }, block, received,
                          DeviceCopy{stream});
        e.failure()) {
      return e;
    }
    return DeviceSum(stream, x.element_type(), received, p.size, out->element_count(),
                     out->untyped_data());
  }
  Staging& s = t_staging;
  JAXSMP_CUDA(Reserve(s.out, total + block), "pinned buffer");  // received blocks, then the sum
  const char* staged = s.in.ptr;
  if (auto e = Exchange(call, *p.channel, p.rank, p.size,
                        [&](int j) { return staged + j * block; }, block, s.out.ptr, HostCopy);
      e.failure()) {
    return e;
  }
  if (auto e = Sum(x.element_type(), s.out.ptr, p.size, out->element_count(), s.out.ptr + total);
      e.failure()) {
    return e;
  }
  return StageOut(stream, out->untyped_data(), total, block, call);
}

}  // namespace
}  // namespace jaxsmp

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsmpMpiAllGatherCuda, jaxsmp::AllGatherCuda,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<::xla::ffi::AnyBuffer>()
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()
                                  .Ret<::xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("tag")
                                  .Attr<int64_t>("timeout_ms")
                                  .Attr<std::string_view>("site"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsmpMpiReduceScatterCuda, jaxsmp::ReduceScatterCuda,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::ScratchAllocator>()
                                  .Arg<::xla::ffi::AnyBuffer>()
                                  .Arg<::xla::ffi::Buffer<::xla::ffi::S32>>()
                                  .Ret<::xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("tag")
                                  .Attr<int64_t>("timeout_ms")
                                  .Attr<std::string_view>("site"));

extern "C" int jaxsmp_mpi_cuda_aware() { return jaxsmp::CudaAware() ? 1 : 0; }
