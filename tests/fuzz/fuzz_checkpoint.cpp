// libFuzzer target for the cache file loaders (scripts/fuzz.sh builds and runs it).
//
// The first byte of an input picks what the rest is:
//   0  a whole file, given to deserialize() as it is;
//   1  a format version byte, then payload bytes, framed with a valid header and checksum (frame_payload), so
//      that mutations reach the payload's parser instead of stopping at the checksum;
//   2  JSON text, given to from_json() (python -m cudnn_cache import).
// Other first bytes are taken modulo 3. A rejected input must throw cudnn_cache::Error and nothing else: any
// other exception escapes and libFuzzer reports it, as it reports crashes, leaks and undefined behaviour.
//
// What a loader accepts must also be a checkpoint the rest of the library can use. So an accepted input is
// saved again and must load again to the same bytes (in binary and through JSON), and merged into an empty
// store it must give back exactly its entries. Its entries, each on its own as a shared store keeps them
// (Note [Entries on a shared store]), must pass the store's decoder under their own names and merge back into
// the same entries; the decoder must refuse, by an Error, what is not one entry of the name it is asked for.
// A violation aborts with the reason on stderr.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <algorithm>
#include <vector>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/exchange.h"
#include "cudnn_cache/report.h"

namespace {

using namespace cudnn_cache;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: accepted input violates: %s\n", what);
  std::abort();
}

// The checkpoint without sections that hold nothing: what a store keeps of it.
Checkpoint without_empty_sections(const Checkpoint& checkpoint) {
  Checkpoint result;
  result.header = checkpoint.header;
  for (const CheckpointSection& section : checkpoint.sections) {
    if (section.size() > 0 || !section.plans.empty()) result.sections.push_back(section);
  }
  return result;
}

// The digests of a checkpoint's entries, sorted.
std::vector<std::uint64_t> digests(const Checkpoint& checkpoint) {
  std::vector<std::uint64_t> result;
  for (const EntryRecord& record : inventory(checkpoint)) result.push_back(record.digest);
  std::sort(result.begin(), result.end());
  return result;
}

// Each entry on its own, through the shared store's decoder, and back together.
void check_entries_alone(const Checkpoint& checkpoint) {
  std::vector<Checkpoint> alone;
  for (const SingleEntry& single : split_entries(checkpoint)) {
    try {
      alone.push_back(deserialize(serialize(single.checkpoint), "one entry"));
      check_single_entry(alone.back(), single.name, "one entry");
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      violated("an entry on its own does not pass the shared store's decoder");
    }
    try {
      check_single_entry(alone.back(), single.name + "0", "one entry, misnamed");
      violated("the shared store's decoder takes an entry under another name");
    } catch (const Error&) {
    }
  }
  if (digests(merge(alone).merged) != digests(checkpoint)) violated("its entries alone merge into other entries");
  if (checkpoint.size() != 1 || checkpoint.pending() != 0) {
    try {
      check_single_entry(checkpoint, "", "not one entry");
      violated("the shared store's decoder takes a checkpoint of another count of entries");
    } catch (const Error&) {
    }
  }
}

// The properties every accepted checkpoint must have; see the comment at the top.
void check_accepted(const Checkpoint& checkpoint) {
  std::string bytes;
  try {
    bytes = serialize(checkpoint);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    violated("it cannot be saved again");
  }
  std::string again;
  try {
    again = serialize(deserialize(bytes, "saved again"));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    violated("saved again, it does not load");
  }
  if (again != bytes) violated("saved, loaded and saved again, its bytes change");
  try {
    if (serialize(from_json(to_json(checkpoint), "exported")) != bytes) {
      violated("exported to JSON and imported, its bytes change");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    violated("its JSON export does not import");
  }
  CacheStore store;
  merge_into(store, checkpoint);
  Checkpoint merged = snapshot(store);
  merged.header = checkpoint.header;
  if (serialize(merged) != serialize(without_empty_sections(checkpoint))) {
    violated("merged into an empty store, its entries change");
  }
  check_entries_alone(checkpoint);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* text = reinterpret_cast<const char*>(data);
  const int mode = data[0] % 3;
  Checkpoint checkpoint;
  try {
    if (mode == 0) {
      checkpoint = deserialize(std::string(text + 1, size - 1), "fuzzed file");
    } else if (mode == 1) {
      if (size < 2) return 0;
      CheckpointHeader header;
      header.format_version = data[1];
      checkpoint = deserialize(frame_payload(header, std::string(text + 2, size - 2)), "fuzzed payload");
    } else {
      checkpoint = from_json(std::string(text + 1, size - 1), "fuzzed JSON");
    }
  } catch (const Error&) {
    return 0;  // rejected, as it should be
  }
  check_accepted(checkpoint);
  return 0;
}
