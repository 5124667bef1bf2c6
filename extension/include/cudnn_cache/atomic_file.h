#pragma once

// Whole-file reads and crash-safe whole-file writes.
//
// Note [Atomic save]
// ~~~~~~~~~~~~~~~~~~
// A cache file is shared by processes, CI jobs and ranks, so a reader must never see half of one and a crash
// must never cost the old one. write_file_atomically therefore writes a temporary file in the *same folder*
// (rename is only atomic within one file system), flushes it with fsync, renames it over the target and
// fsyncs the folder so the rename itself is durable. Until the rename the old file is untouched; after it the
// new file is complete. A crash in between can leave a temporary ".<name>.tmp.XXXXXX" behind, which nothing
// reads; any failure we can see removes it and throws Error naming the file and the reason.

#include <string>

namespace cudnn_cache {

// The whole content of the file. Throws Error naming the file and the reason if it cannot be read.
std::string read_file(const std::string& path);

// Replaces (or creates) the file with exactly these bytes, atomically; see Note [Atomic save].
// An existing file keeps its permission bits; a new one gets 0644.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace cudnn_cache
