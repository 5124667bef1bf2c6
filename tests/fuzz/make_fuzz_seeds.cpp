// Writes the seed corpus of fuzz_checkpoint into a folder: valid files of every format version (as whole files,
// as framed payloads and as JSON exports, each with the mode byte fuzz_checkpoint.cpp describes), and damaged
// ones: truncated, bit-flipped, with the wrong magic, a newer or zero format version, a wrong checksum.
//
// usage: make_fuzz_seeds FOLDER

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/synthetic.h"

namespace {

using namespace cudnn_cache;

constexpr char kFile = 0, kPayload = 1, kJson = 2;
constexpr std::size_t kHeaderBytes = 29;  // the layout drawn in checkpoint.cpp
constexpr std::size_t kVersionOffset = 9;

std::string folder;
int written = 0;

void write_seed(const std::string& name, char mode, const std::string& bytes) {
  std::ofstream out(folder + "/" + name, std::ios::binary | std::ios::trunc);
  out.put(mode);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::cerr << "make_fuzz_seeds: cannot write " << folder << "/" << name << '\n';
    std::exit(1);
  }
  ++written;
}

// A small checkpoint in format `version`: synthetic entries of two origins, with what that version can hold.
Checkpoint sample(std::uint32_t version, std::size_t entries, std::uint64_t seed) {
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), entries, seed);
  add_synthetic_entries(store, Origin::of(DeviceIdentity{"Other GPU", 8, 6, 84}, CudnnVersion{9, 1, 0}),
                        entries / 2 + 1, seed + 1);
  Checkpoint checkpoint = snapshot(store);
  checkpoint.header.format_version = version;
  for (CheckpointSection& section : checkpoint.sections) {
    if (version < 2) {
      section.graph_forward.clear();
      section.graph_backward_data.clear();
      section.graph_backward_filter.clear();
    }
    if (version >= 3 && !section.graph_forward.empty()) {  // a stored plan for a graph entry
      StoredPlan plan;
      plan.config = section.graph_forward.front().second.front();
      plan.cudnn_version = 91900;
      plan.bytes = {1, 2, 3, 4, 5, 6, 7, 8};
      section.plans.emplace_back(section.graph_forward.front().first,
                                 std::make_shared<const StoredPlan>(std::move(plan)));
    }
    if (version >= 4) {  // pending keys: an entry's key of the other API, which the caches of this one lack
      if (!section.forward.empty()) section.pending_graph.push_back(section.forward.front().first);
      if (!section.graph_forward.empty()) section.pending_legacy.push_back(section.graph_forward.front().first);
    }
    if (version >= 6 && !section.plans.empty()) {  // an attention plan
      AttentionKey key;
      key.data_type = CUDNN_DATA_BFLOAT16;
      key.stats = 1;
      key.q = key.k = key.v = key.o = {{2, 4, 50, 64}, {12800, 64, 256, 1}};
      section.attention.emplace_back(key, section.plans.front().second);
    }
  }
  return checkpoint;
}

void put_u32(std::string& bytes, std::size_t offset, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds FOLDER\n";
    return 2;
  }
  folder = argv[1];
  std::mt19937 random(7);
  for (std::uint32_t version = 1; version <= kFormatVersion; ++version) {
    for (std::size_t entries : {1, 4}) {
      const std::string tag = "v" + std::to_string(version) + "-" + std::to_string(entries);
      const Checkpoint checkpoint = sample(version, entries, version * 10 + entries);
      const std::string bytes = serialize(checkpoint);
      write_seed(tag + ".file", kFile, bytes);
      const std::string payload = bytes.substr(kHeaderBytes, bytes.size() - kHeaderBytes - 8);
      write_seed(tag + ".payload", kPayload, std::string(1, static_cast<char>(version)) + payload);
      write_seed(tag + ".json", kJson, to_json(checkpoint));
      if (entries != 4) continue;
      // Damaged copies of the larger file.
      write_seed(tag + "-truncated-header.file", kFile, bytes.substr(0, 20));
      write_seed(tag + "-truncated-payload.file", kFile, bytes.substr(0, bytes.size() / 2));
      write_seed(tag + "-truncated-payload.payload", kPayload,
                 std::string(1, static_cast<char>(version)) + payload.substr(0, payload.size() / 2));
      write_seed(tag + "-truncated.json", kJson, to_json(checkpoint).substr(0, 300));
      std::string flipped = bytes;
      flipped[std::uniform_int_distribution<std::size_t>(0, bytes.size() - 1)(random)] ^= 0x10;
      write_seed(tag + "-bit-flip.file", kFile, flipped);
      std::string wrong_magic = bytes;
      wrong_magic[3] = 'X';
      write_seed(tag + "-wrong-magic.file", kFile, wrong_magic);
      std::string newer = bytes;
      put_u32(newer, kVersionOffset, kFormatVersion + 1);
      write_seed(tag + "-newer.file", kFile, newer);
      std::string zero = bytes;
      put_u32(zero, kVersionOffset, 0);
      write_seed(tag + "-version-0.file", kFile, zero);
      std::string bad_checksum = bytes;
      bad_checksum[bytes.size() - 1] ^= 0x01;
      write_seed(tag + "-checksum.file", kFile, bad_checksum);
    }
  }
  std::cout << "make_fuzz_seeds: wrote " << written << " seeds into " << folder << '\n';
  return 0;
}
