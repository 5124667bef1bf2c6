#pragma once

// Synthetic cache content: valid, varied entries for tests, fuzz seeds and load benchmarks.

#include <cstdint>
#include <string>

#include "cudnn_cache/checkpoint.h"

namespace cudnn_cache {

// The origin synthetic entries are filed under: a made-up GPU no process runs on, and this cuDNN.
Origin synthetic_origin();

// The most entries one call makes: ten times the largest benchmark's, far beyond any real cache (a network has
// tens to hundreds of convolutions), and about 350 MB of memory while they are made and saved (a 37 MB file). A
// larger request is refused: the kernel would end the process, with no message, before it were done.
inline constexpr std::size_t kMaxSyntheticEntries = 100'000;

// Adds `entries` (at most kMaxSyntheticEntries; Error otherwise) distinct, valid entries (1-D, 2-D and 3-D problems
// over every supported data type, layout, stride, dilation and group count, spread over the three directions of both
// the legacy and the graph-API caches) to the store under `origin`. The same seed gives the same entries.
void add_synthetic_entries(CacheStore& store, const Origin& origin, std::size_t entries, std::uint64_t seed = 1);

// Replaces the file at `path` with `entries` synthetic entries under synthetic_origin() (no merge, atomically)
// and returns how many it holds. What `cudnn_cache_tool synth` and `python -m cudnn_cache synth` write.
std::size_t write_synthetic_file(const std::string& path, std::size_t entries, std::uint64_t seed = 1);

// Stores a synthetic ranking for the key under `origin`, in the graph API's cache of its direction when
// `graph`, else in the legacy one (merged with what the key holds). The same seed gives the same ranking.
// Stands in for a search where there is no GPU: the distributed tests tune with it.
void add_synthetic_ranking(CacheStore& store, const Origin& origin, bool graph, const ConvolutionKey& key,
                           std::uint64_t seed = 1);

}  // namespace cudnn_cache
