#pragma once

// The cache file: every origin's rankings in cereal's portable binary archive, framed by a header and closed
// by a checksum. checkpoint.cpp draws the layout.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "cudnn_cache/cache_store.h"
#include "cudnn_cache/device.h"
#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache {

// The format this build writes; it reads every version from 1 up to this one. Version 2 added the graph API's
// engine configs, version 3 stored plans (Note [Stored plans]); older files simply have none. Version 4 engine
// configs may be positions in heuristics' list (EngineCandidate::heuristic_index, the config's cereal class
// version 2), and each origin's pending keys follow its stored plans (Note [Pending keys] in cache_store.h):
// earlier builds cannot read them, hence the new number. Version 5 engine configs carry cuDNN's numerical notes
// (EngineCandidate::numerical_notes, class version 3), so that deterministic calls can run the deterministic
// ones (Note [Deterministic calls] in runtime.h). Version 6 adds each origin's stored attention plans after its
// pending keys (Note [Persisted attention plans] in attention.h). (A file of an older format written by this
// build, as the reader's tests write them, has what this build writes.)
inline constexpr std::uint32_t kFormatVersion = 6;

// The first bytes of every cache file after cereal's endianness byte.
inline constexpr std::array<char, 8> kMagic = {'C', 'D', 'N', 'N', 'C', 'A', 'C', 'H'};

// The versions a file was written with.
struct CheckpointHeader {
  std::uint32_t format_version = kFormatVersion;
  std::uint32_t cudnn_version = 0;         // CudnnVersion::number() of the writer, e.g. 91900
  std::uint32_t cuda_runtime_version = 0;  // cudaRuntimeGetVersion() of the writer, e.g. 13000
};

// The entries of one origin, each cache sorted by key.
struct CheckpointSection {
  Origin origin;
  std::vector<PerfCache<ForwardTraits>::Entry> forward;
  std::vector<PerfCache<BackwardDataTraits>::Entry> backward_data;
  std::vector<PerfCache<BackwardFilterTraits>::Entry> backward_filter;
  std::vector<PerfCache<GraphForwardTraits>::Entry> graph_forward;
  std::vector<PerfCache<GraphBackwardDataTraits>::Entry> graph_backward_data;
  std::vector<PerfCache<GraphBackwardFilterTraits>::Entry> graph_backward_filter;
  std::vector<PlanStore::Entry> plans;  // sorted by key
  // Keys met and not tuned, of the graph API's caches and the legacy ones, sorted (Note [Pending keys]).
  std::vector<ConvolutionKey> pending_graph, pending_legacy;
  std::vector<AttentionPlanStore::Entry> attention;  // stored attention plans, sorted by key

  template <typename Traits>
  std::vector<typename PerfCache<Traits>::Entry>& entries() {
    return std::get<std::vector<typename PerfCache<Traits>::Entry>&>(std::tie(
        forward, backward_data, backward_filter, graph_forward, graph_backward_data, graph_backward_filter));
  }
  template <typename Traits>
  const std::vector<typename PerfCache<Traits>::Entry>& entries() const {
    return const_cast<CheckpointSection*>(this)->entries<Traits>();
  }

  std::size_t size() const {
    return forward.size() + backward_data.size() + backward_filter.size() + graph_forward.size() +
           graph_backward_data.size() + graph_backward_filter.size();
  }
  std::size_t pending() const { return pending_graph.size() + pending_legacy.size(); }
};

// The whole content of a cache file, detached from any store.
struct Checkpoint {
  CheckpointHeader header;
  std::vector<CheckpointSection> sections;  // sorted by origin, one per origin

  std::size_t size() const;
  std::size_t pending() const;  // pending keys over all sections
};

// What a load did.
struct LoadReport {
  CheckpointHeader header;            // the versions the file was written with
  std::size_t entries = 0;            // entries in the file, all merged into the store
  std::size_t other_cudnn_entries = 0;  // of those, measured with another cuDNN major.minor: kept, never used
  std::size_t plans = 0;              // stored plans in the file, all merged into the store
  std::size_t pending = 0;            // pending keys in the file, all merged into the store
};

// The file's 64-bit checksum (Note [Checksum] in checkpoint.cpp) of any bytes; also the digest of entries.
std::uint64_t checksum(const char* data, std::size_t size);

// A copy of every entry of the store, stamped with this process's cuDNN and CUDA runtime versions.
Checkpoint snapshot(const CacheStore& store);

// Merges every entry into the store (Note [Selection, merge and fallback policy]).
void merge_into(CacheStore& store, Checkpoint checkpoint);

// The file's bytes for a checkpoint, in the format version its header names (kFormatVersion from snapshot).
// Throws Error if that version cannot hold its content (graph-API entries need version 2, stored plans 3,
// pending keys 4, attention plans 6).
std::string serialize(const Checkpoint& checkpoint);

// A file's bytes for a header and payload bytes taken as they are: the header, the payload and the checksum
// over both. serialize() frames its payload with it; tests and the fuzzer use it to make files whose payload
// is damaged or forged but whose checksum holds, so that the payload's own checks are reached.
std::string frame_payload(const CheckpointHeader& header, const std::string& payload);

// Parses and checks a file's bytes. `source` names them in errors. Throws Error saying what is wrong: wrong
// magic, newer format, truncated, checksum mismatch, or an invalid entry.
Checkpoint deserialize(const std::string& bytes, const std::string& source);

// The checkpoint as JSON text (cereal's JSON archive): the header's versions, then per origin its six caches
// and its stored plans (their bytes in base64). For reading, diffing and editing by hand.
std::string to_json(const Checkpoint& checkpoint);

// Parses what to_json wrote, with the checks deserialize makes. `source` names the text in errors.
Checkpoint from_json(const std::string& text, const std::string& source);

// Reads and checks a cache file without touching any store.
Checkpoint read_checkpoint(const std::string& path);

// How save() treats the file it writes; see Note [Shared cache files].
struct SaveOptions {
  bool merge = true;                  // keep what the file holds, merged with the store; false: replace it
  double lock_timeout_seconds = 60.0;  // how long to wait for another process's save (>= 0)
  std::function<void(const std::string&)> warn;  // the file system has no locks; stderr when empty
};

// What save() wrote.
struct SaveReport {
  std::size_t entries = 0;       // entries in the file now
  std::size_t file_entries = 0;  // entries the file held before, merged in (0 when replacing or new)
  bool locked = true;            // false where the file system has no locks
};

// Writes every entry of the store to the file, atomically (Note [Atomic save]), under the file's lock; by
// default merged with the entries the file already holds (Note [Shared cache files]), so nothing another
// process saved is lost. The store itself is not changed. Throws Error naming the file when it cannot: a
// file that is there but cannot be read or is not a valid cache file is never overwritten by a merging
// save (move it aside, or save with merge off to replace it).
SaveReport save(const CacheStore& store, const std::string& path, const SaveOptions& options = {});

// Reads the file and merges it into the store, all or nothing: on any error the store is unchanged.
// Entries of another cuDNN major.minor than `running` are kept but never used, and counted in the report.
LoadReport load(CacheStore& store, const std::string& path, const CudnnVersion& running = CudnnVersion::of_library());

}  // namespace cudnn_cache
