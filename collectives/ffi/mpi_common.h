// Shared by the CPU handlers (mpi_collectives.cc) and the CUDA ones (mpi_collectives_cuda.cu):
// the registry of MPI communicators ("channels"), the all-to-all exchange with a timeout,
// and the host-side block sum of the reduce-scatter.
//
// A channel is one MPI communicator over the processes that hold the devices of one group of
// a mesh axis (one sdp group, one local-device lane of it). Python creates them with
// jaxsmp_mpi_split and passes each device's (channel id, expected rank) as an int32[2]
// operand; id -1 is the whole world (one device per process, or plain jit per process).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jaxsmp {

namespace ffi = xla::ffi;

struct Channel {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<int> world_ranks;  // world rank of each rank of comm
};

inline std::mutex g_mutex;
inline MPI_Comm g_world = MPI_COMM_NULL;         // private duplicate of MPI_COMM_WORLD
inline MPI_Comm g_split_parent = MPI_COMM_NULL;  // another one, only for MPI_Comm_split
inline std::unordered_map<int32_t, Channel> g_channels;

// What an error message names: the collective, where it was traced, its tag and timeout.
struct Call {
  const char* op;
  std::string site;  // a copy: the CPU handlers finish on another thread
  int64_t tag;
  int64_t timeout_ms;
};

inline std::string Describe(const Call& call) {
  return std::string("ffi ") + call.op + " traced at " + std::string(call.site) + " (tag " +
         std::to_string(call.tag) + ")";
}

inline ffi::Error MpiError(int code, const Call& call, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return ffi::Error(ffi::ErrorCode::kInternal,
                    Describe(call) + ": " + what + ": " + std::string(text, len));
}

// The channel of id ``where[0]``, checking that this process is its rank ``where[1]``.
inline ffi::Error Resolve(const int32_t* where, const Call& call, const Channel** out,
                          int* rank, int* size) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_world == MPI_COMM_NULL) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      Describe(call) + ": MPI not initialised (call jaxsmp_mpi_init first)");
  }
  static Channel world;
  if (where[0] < 0) {
    world.comm = g_world;
    *out = &world;
  } else {
    auto it = g_channels.find(where[0]);
    if (it == g_channels.end()) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        Describe(call) + ": this process is not in MPI channel " +
                            std::to_string(where[0]) +
                            ": the mesh given to collectives.scope(mesh=...) is not the mesh "
                            "of the shard_map");
    }
    *out = &it->second;
  }
  MPI_Comm_rank((*out)->comm, rank);
  MPI_Comm_size((*out)->comm, size);
  if (where[1] >= 0 && where[1] != *rank) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      Describe(call) + ": mesh position " + std::to_string(where[1]) +
                          " != MPI rank " + std::to_string(*rank) + " in channel " +
                          std::to_string(where[0]) +
                          (where[0] < 0 ? ": without collectives.scope(mesh=...) the axis "
                                          "index must equal the MPI rank (process_id = rank)"
                                        : ""));
  }
  return ffi::Error::Success();
}

inline int WorldRank(const Channel& channel, int rank) {
  if (channel.world_ranks.empty()) return rank;  // the world itself
  return channel.world_ranks[rank];
}

// Wait for all requests; after call.timeout_ms, cancel them and name the peers still owed.
inline ffi::Error WaitAll(std::vector<MPI_Request>& requests, const std::vector<int>& peers,
                          const Channel& channel, int rank, const Call& call) {
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::milliseconds(call.timeout_ms);
  std::vector<MPI_Status> statuses(requests.size());
  for (int polls = 0;; ++polls) {
    int done = 0;
    int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                         statuses.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (size_t i = 0; i < statuses.size(); ++i) {
        int e = statuses[i].MPI_ERROR;
        if (e != MPI_SUCCESS && e != MPI_ERR_PENDING) {
          std::string what = "message with world rank " +
                             std::to_string(WorldRank(channel, peers[i]));
          return MpiError(e, call, what.c_str());
        }
      }
    }
    if (rc != MPI_SUCCESS) return MpiError(rc, call, "MPI_Testall");
    if (done) return ffi::Error::Success();
    if (std::chrono::steady_clock::now() > deadline) break;
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));  // yield cores
  }
  std::vector<int> waiting;
  for (size_t i = 0; i < requests.size(); ++i) {
    int complete = 0;
    MPI_Request_get_status(requests[i], &complete, MPI_STATUS_IGNORE);
    if (complete) {
      MPI_Wait(&requests[i], MPI_STATUS_IGNORE);
      continue;
    }
    int w = WorldRank(channel, peers[i]);
    if (std::find(waiting.begin(), waiting.end(), w) == waiting.end()) waiting.push_back(w);
    MPI_Cancel(&requests[i]);
    MPI_Request_free(&requests[i]);
  }
  std::sort(waiting.begin(), waiting.end());
  std::string list;
  for (int w : waiting) list += (list.empty() ? "" : ", ") + std::to_string(w);
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.4g", call.timeout_ms / 1000.0);
  return ffi::Error(
      ffi::ErrorCode::kDeadlineExceeded,
      Describe(call) + ": timed out after " + seconds + " s: world rank " +
          std::to_string(WorldRank(channel, rank)) + " waited for world ranks [" + list +
          "] (a peer that never reached this collective, or traced a different program); "
          "raise the limit with collectives.scope(timeout=...) or JAXSMP_COLLECTIVES_TIMEOUT");
}

// For every peer j: send send_block(j) (block_bytes) and receive into recv + j * block_bytes;
// copy_own(dst, src, bytes) places this rank's own block (memcpy, or a device copy).
template <typename SendBlock, typename CopyOwn>
ffi::Error Exchange(const Call& call, const Channel& channel, int rank, int size,
                    SendBlock send_block, size_t block_bytes, char* recv, CopyOwn copy_own) {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  requests.reserve(2 * size);
  for (int j = 0; j < size; ++j) {
    if (j == rank) continue;
    MPI_Request r;
    int rc = MPI_Irecv_c(recv + j * block_bytes, static_cast<MPI_Count>(block_bytes), MPI_BYTE,
                         j, static_cast<int>(call.tag), channel.comm, &r);
    if (rc != MPI_SUCCESS) return MpiError(rc, call, "MPI_Irecv_c");
    requests.push_back(r);
    peers.push_back(j);
  }
  for (int k = 1; k < size; ++k) {  // staggered start: rank r sends to r+1 first
    int j = (rank + k) % size;
    MPI_Request r;
    int rc = MPI_Isend_c(send_block(j), static_cast<MPI_Count>(block_bytes), MPI_BYTE, j,
                         static_cast<int>(call.tag), channel.comm, &r);
    if (rc != MPI_SUCCESS) return MpiError(rc, call, "MPI_Isend_c");
    requests.push_back(r);
    peers.push_back(j);
  }
  copy_own(recv + rank * block_bytes, send_block(rank), block_bytes);
  return WaitAll(requests, peers, channel, rank, call);
}

// Host-side sum of ``size`` blocks of n elements each (the reduce-scatter's reduction);
// defined in mpi_collectives.cc (compiled by the host compiler in every build).
ffi::Error Sum(ffi::DataType type, const char* blocks, int size, size_t n, char* out);

inline ffi::Error CheckSizes(const Call& call, size_t small, size_t large, int size) {
  if (large != small * static_cast<size_t>(size)) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      Describe(call) + ": buffer sizes " + std::to_string(small) + " and " +
                          std::to_string(large) + " are not 1 : " + std::to_string(size) +
                          " (channel size)");
  }
  return ffi::Error::Success();
}

}  // namespace jaxsmp
