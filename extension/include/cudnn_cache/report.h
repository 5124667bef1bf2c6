#pragma once

// Cache files as people read them: summaries, entry tables, differences and merges. The command-line tool
// and the Python CLI (python -m cudnn_cache) print these; the tests read them.

#include <string>
#include <vector>

#include "cudnn_cache/checkpoint.h"

namespace cudnn_cache {

// "N entries for M device/cuDNN origin(s); file format F, written with cuDNN X, CUDA runtime Y; P stored plans".
std::string summary(const Checkpoint& checkpoint);

// A table of every entry (direction, shapes, convolution, dtype, layout, api, best candidate, its time and
// workspace, origin), one line each, then the summary.
std::string entry_table(const Checkpoint& checkpoint);

// Entries per origin and cache, and stored plans per origin, as lines of text.
std::string statistics(const Checkpoint& checkpoint);

// One key of one cache of one origin, as two checkpoints (or a merge) see it.
struct EntryDifference {
  Origin origin;
  std::string cache;  // e.g. "graph forward", "legacy backward_data"
  ConvolutionKey key;
  std::string first;   // the best candidate of the first side, with its time; "-" where it has no entry
  std::string second;  // the same of the second side
};

// The entries two checkpoints do not share, and those whose best candidate differs.
struct CheckpointDiff {
  std::vector<EntryDifference> only_first, only_second, different_best;
  std::size_t same = 0;  // entries in both with the same best candidate

  bool identical() const { return only_first.empty() && only_second.empty() && different_best.empty(); }
};

CheckpointDiff diff(const Checkpoint& first, const Checkpoint& second);

// One checkpoint of all of them, merged by Note [Selection, merge and fallback policy] (per candidate, the
// faster measurement wins; stored plans of a later checkpoint replace earlier ones). `conflicts` lists the
// keys that two inputs rank with different best candidates: `first` is the earlier best, `second` the
// later one, and the merged ranking starts with the faster of the two.
struct MergeResult {
  Checkpoint merged;
  std::vector<EntryDifference> conflicts;
};

MergeResult merge(const std::vector<Checkpoint>& checkpoints);

// The commands both command lines run on files (python -m cudnn_cache and cudnn_cache_tool print what these
// return, in the same words): each reads its inputs whole before it writes anything, and writes atomically.
// Errors name the file and the reason.

// One line per difference: "graph forward on ORIGIN: KEY: engine 5 (...) 0.0120 ms | engine 7 (...) 0.0150 ms".
std::vector<std::string> difference_lines(const std::vector<EntryDifference>& differences);
// Merges the files into `output`; returns the conflicts, as difference_lines.
std::vector<std::string> merge_files(const std::vector<std::string>& inputs, const std::string& output);
// Writes the cache file of a JSON export (to_json) to `output`, in this build's format.
void import_json_file(const std::string& json_path, const std::string& output);

}  // namespace cudnn_cache
