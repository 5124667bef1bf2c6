#pragma once

// Sharing tuning between processes: each entry named by what it is for and by a digest of its content, so
// that processes can tell what the others lack and send only that.
//
// Note [Sharing tuning between processes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cudnn_cache.distributed.sync (torch_ops/cudnn_cache/distributed.py) runs over torch.distributed, any
// backend, in three collective steps:
//   1. every rank all-gathers its identity (the Origin of its GPU: device identity and cuDNN major.minor),
//      the problems it needs (by default the misses the record policy remembered: backend + key; a key
//      carries every size, stride, dtype and parameter, so any rank can re-create the tensors) and its
//      inventory (below);
//   2. a needed problem that no rank of the same identity holds is untuned; the untuned problems of an
//      identity are ordered by estimated cost and dealt to the ranks of that identity in snake order
//      (0..N-1, N-1..0), so each tunes about 1/N of them and nobody tunes one twice. Ranks of another
//      identity never tune for it: a ranking is only valid where it was measured;
//   3. every distinct entry (by digest) that some receiving rank lacks is sent once, by the lowest rank
//      holding it, together with what each rank tuned, as the bytes of a checkpoint in uint8 tensors
//      (all_gather); each rank merges what it receives with merge_into (Note [Selection, merge and
//      fallback policy]: per candidate the faster measurement wins), so all ranks end with the same union.
// Entries of other identities are filed under their own origin: a process only ever runs the rankings of
// its own GPU and cuDNN, so keeping them costs nothing and lets any rank save a file for the whole fleet.
//
// An inventory lists, per entry, its origin, cache (backend and direction) and key, and a digest of its
// content: the ranking and, for graph-API entries, the stored plan. Equal digests mean equal content.

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/runtime.h"

namespace cudnn_cache {

// One entry of a checkpoint, as processes that share tuning name it.
struct EntryRecord {
  Origin origin;
  Backend backend = Backend::graph;
  ConvolutionKey key;
  std::uint64_t digest = 0;  // of origin, cache, key, ranking and stored plan
};

// Every entry of the checkpoint, in its order (origin, then cache, then key).
std::vector<EntryRecord> inventory(const Checkpoint& checkpoint);

// The entries whose digest is in `digests`, each with its stored plan if it has one.
Checkpoint select(const Checkpoint& checkpoint, const std::unordered_set<std::uint64_t>& digests);

// The sections of `origin` only.
Checkpoint only_origin(const Checkpoint& checkpoint, const Origin& origin);

// Note [Entries on a shared store]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A shared store (cudnn_cache/remote.py: Redis) keeps each entry on its own, as the bytes of a checkpoint that
// holds just that entry and its stored plan: the file's format, so what comes back is checked exactly like a
// file (magic, versions, sizes, enums, checksum), and two versions of the format never read each other's.
// Its name there says what it is for: the origin's tag and the entry's tag (backend and key, the key
// including its direction), each the file's checksum (Note [Checksum]) over the portable archive of those
// values, in hex. The same entry gets the same name in every process and on every platform, so writers
// merge into one slot; an entry read back under another name than its own is refused (it was written
// there by something else, or damaged past its checksum's reach).

// The tag of an origin on a shared store: 16 hex digits.
std::string origin_tag(const Origin& origin);

// An entry on its own, and its name on a shared store: "<origin tag>:<entry tag>".
struct SingleEntry {
  Origin origin;
  std::string name;
  Checkpoint checkpoint;  // this entry and its stored plan; no pending keys
};

// Every entry of the checkpoint on its own, in its order.
std::vector<SingleEntry> split_entries(const Checkpoint& checkpoint);

// The shared-store names of the entries the store holds by replace(), sorted: a push writes those in place of the
// server's copies, as a merging save does with a file's (Note [A settled key replaces the file's], perf_cache.h).
std::vector<std::string> replaced_entry_names(const CacheStore& store);

// The one entry of `checkpoint` checked to be a single entry named `name`; throws Error naming `source`
// when it holds another count of entries, pending keys, or an entry of another name.
void check_single_entry(const Checkpoint& checkpoint, const std::string& name, const std::string& source);

}  // namespace cudnn_cache
