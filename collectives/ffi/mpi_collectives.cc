// All-gather and reduce-scatter between MPI processes as XLA FFI handlers (CPU).
//
// Pattern: direct all-to-all. Every rank posts MPI_Irecv_c from and MPI_Isend_c to every
// peer at once (tagged per call site, so concurrently running calls never mix), copies
// its own block locally and waits for all. Blocks are the rows of the leading dimension:
// all-gather sends its whole input to each peer; reduce-scatter sends input block j to
// rank j and sums the p received blocks in rank order.
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

MPI_Comm g_comm = MPI_COMM_NULL;  // private duplicate of MPI_COMM_WORLD

ffi::Error MpiError(int code, const std::string& what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return ffi::Error(ffi::ErrorCode::kInternal, what + ": " + std::string(text, len));
}

ffi::Error CheckReady(int32_t expected_rank, int* rank, int* size) {
  if (g_comm == MPI_COMM_NULL) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "MPI not initialised: call jaxsmp_mpi_init() first");
  }
  MPI_Comm_rank(g_comm, rank);
  MPI_Comm_size(g_comm, size);
  if (expected_rank >= 0 && expected_rank != *rank) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "mesh axis index " + std::to_string(expected_rank) + " != MPI rank " +
                          std::to_string(*rank) +
                          ": order the mesh devices by MPI rank (process_id = rank)");
  }
  return ffi::Error::Success();
}

// For every peer j: send send_block(j) (block_bytes) and receive into recv + j * block_bytes.
template <typename SendBlock>
ffi::Error Exchange(SendBlock send_block, size_t block_bytes, char* recv, int rank, int size,
                    int tag) {
  std::vector<MPI_Request> requests;
  requests.reserve(2 * size);
  for (int j = 0; j < size; ++j) {
    if (j == rank) continue;
    MPI_Request r;
    int rc = MPI_Irecv_c(recv + j * block_bytes, static_cast<MPI_Count>(block_bytes), MPI_BYTE,
                         j, tag, g_comm, &r);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Irecv_c");
    requests.push_back(r);
  }
  for (int k = 1; k < size; ++k) {  // staggered start: rank r sends to r+1 first
    int j = (rank + k) % size;
    MPI_Request r;
    int rc = MPI_Isend_c(send_block(j), static_cast<MPI_Count>(block_bytes), MPI_BYTE, j, tag,
                         g_comm, &r);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Isend_c");
    requests.push_back(r);
  }
  std::memcpy(recv + rank * block_bytes, send_block(rank), block_bytes);
  int rc = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Waitall");
  return ffi::Error::Success();
}

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
    default:
      return ffi::Error(ffi::ErrorCode::kUnimplemented,
                        "reduce-scatter: unsupported element type " +
                            std::to_string(static_cast<int>(type)));
  }
  return ffi::Error::Success();
}

ffi::Error AllGatherImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> expected_rank,
                         ffi::Result<ffi::AnyBuffer> out, int64_t tag) {
  int rank, size;
  if (auto e = CheckReady(expected_rank.typed_data()[0], &rank, &size); e.failure()) return e;
  size_t block = x.size_bytes();
  if (out->size_bytes() != block * size) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "all-gather: output is not world x input");
  }
  const char* send = static_cast<const char*>(x.untyped_data());
  return Exchange([&](int) { return send; }, block, static_cast<char*>(out->untyped_data()),
                  rank, size, static_cast<int>(tag));
}

ffi::Error ReduceScatterImpl(ffi::AnyBuffer x, ffi::Buffer<ffi::S32> expected_rank,
                             ffi::Result<ffi::AnyBuffer> out, int64_t tag) {
  int rank, size;
  if (auto e = CheckReady(expected_rank.typed_data()[0], &rank, &size); e.failure()) return e;
  size_t block = out->size_bytes();
  if (x.size_bytes() != block * size) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "reduce-scatter: input is not world x output");
  }
  const char* send = static_cast<const char*>(x.untyped_data());
  std::vector<char> received(block * size);
  if (auto e = Exchange([&](int j) { return send + j * block; }, block, received.data(), rank,
                        size, static_cast<int>(tag));
      e.failure()) {
    return e;
  }
  return Sum(x.element_type(), received.data(), size, out->element_count(),
             static_cast<char*>(out->untyped_data()));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsmpMpiAllGather, AllGatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("tag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsmpMpiReduceScatter, ReduceScatterImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("tag"));

extern "C" {

// Initialise MPI (thread-multiple) once; returns 0 on success.
int jaxsmp_mpi_init() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return 1;
    if (provided < MPI_THREAD_MULTIPLE) return 2;
  }
  if (g_comm == MPI_COMM_NULL && MPI_Comm_dup(MPI_COMM_WORLD, &g_comm) != MPI_SUCCESS) return 3;
  return 0;
}

int jaxsmp_mpi_rank() {
  int r = -1;
  if (g_comm != MPI_COMM_NULL) MPI_Comm_rank(g_comm, &r);
  return r;
}

int jaxsmp_mpi_size() {
  int s = -1;
  if (g_comm != MPI_COMM_NULL) MPI_Comm_size(g_comm, &s);
  return s;
}

int jaxsmp_mpi_tag_ub() {
  int* value = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
  return flag ? *value : 32767;
}

void jaxsmp_mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);
  MPI_Finalize();
}

}  // extern "C"
