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

//
// Note [Shared cache files]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Many processes (ranks, jobs, machines on a shared file system) may save into one file. An atomic write
// alone keeps the file whole but lets the last writer win: what the others added is gone. So a save takes an
// exclusive advisory lock (flock) on a side file "<file>.lock", reads what the file holds, merges its own
// entries in (Note [Selection, merge and fallback policy]), writes the result atomically and only then lets
// go. flock rather than fcntl: fcntl locks belong to the process, so two threads of one process would not
// exclude each other, and closing any descriptor of the file drops them. The lock file stays (empty):
// removing it while another process waits on it would let a third one lock a new file of the same name.
// A lock is released by the kernel when its holder dies, so a crashed saver never blocks the others.
// Waiting is bounded; a timeout is an error naming the file and what to do. Where the file system has no
// locks (flock fails with ENOLCK, EOPNOTSUPP or ENOSYS, as on some network file systems), the save goes on
// without one and says so once through the warning callback: concurrent savers may then lose entries.

#include <cstddef>
#include <functional>
#include <string>

namespace cudnn_cache {

// A regular file open for reading, for reads at any offset (a large cache file is checked and parsed in
// pieces, not held whole). Throws Error naming the file and the reason if it cannot be opened, or if it is not
// a regular file (a FIFO is refused without waiting for a writer).
class ReadableFile {
 public:
  explicit ReadableFile(const std::string& path);
  ~ReadableFile();
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;

  // Its size when it was opened.
  std::size_t size() const { return size_; }
  // Reads up to `count` bytes at `offset` into `data`; fewer only where the file ends. Throws Error naming the
  // file on a read error.
  std::size_t read_at(std::size_t offset, char* data, std::size_t count) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
};

// The whole content of the file. Throws Error naming the file and the reason if it cannot be read.
std::string read_file(const std::string& path);

// Throws Error naming `path` unless a save may replace it: a file name (not empty, no trailing '/') of a regular
// file or of nothing yet. A directory, FIFO or device is refused before anything is created next to it.
void require_file_target(const std::string& path);

// Replaces (or creates) the file with exactly these bytes, atomically; see Note [Atomic save].
// An existing file keeps its permission bits; a new one gets 0644.
void write_file_atomically(const std::string& path, const std::string& bytes);

// The side file whose lock guards `path`: "<path>.lock".
std::string lock_path_of(const std::string& path);

// An exclusive advisory lock on lock_path_of(path), held until destroyed; see Note [Shared cache files].
class FileLock {
 public:
  // Waits at most `timeout_seconds` (>= 0) for the lock. Throws Error naming the file, the timeout and what to
  // do when it is not granted in time, or when the lock file cannot be opened. Where the file system has no
  // locks, calls `warn` with the reason (stderr when empty) and holds nothing.
  FileLock(const std::string& path, double timeout_seconds, const std::function<void(const std::string&)>& warn = {});
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  // False where the file system has no locks and the save goes on without one.
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace cudnn_cache
