#include "cudnn_cache/atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <iostream>
#include <thread>
#include <cstring>
#include <algorithm>
#include <vector>

#include "cudnn_cache/error.h"

namespace cudnn_cache {
namespace {

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

[[noreturn]] void fail(const std::string& path, const char* step, int error_number) {
  throw Error(detail::concat("cannot save '", path, "': ", step, ": ", std::strerror(error_number),
                             "; the previous file, if any, is unchanged"));
}

// Owns the temporary file until it is renamed: closes and removes it on every early exit.
class TemporaryFile {
 public:
  explicit TemporaryFile(const std::string& target) : target_(target) {
    std::string pattern = folder_of(target) + "/." + name_of(target) + ".tmp.XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    fd_ = ::mkstemp(buffer.data());
    if (fd_ < 0) fail(target, "cannot create a temporary file in its folder", errno);
    path_ = buffer.data();
  }
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  void write_all(const std::string& bytes) {
    const char* data = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      const ssize_t written = ::write(fd_, data, left);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) fail(target_, "write failed", written < 0 ? errno : EIO);
      data += written;
      left -= static_cast<std::size_t>(written);
    }
  }

  void set_mode(mode_t mode) {
    if (::fchmod(fd_, mode) != 0) fail(target_, "cannot set permissions", errno);
  }

  // fsync, close and rename over the target; from here on the temporary file is the target.
  void commit() {
    if (::fsync(fd_) != 0) fail(target_, "fsync failed", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(target_, "close failed", errno);
    if (::rename(path_.c_str(), target_.c_str()) != 0) fail(target_, "rename failed", errno);
    path_.clear();
  }

 private:
  std::string target_;
  std::string path_;
  int fd_ = -1;
};

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // the rename is done; durability of the folder entry is best effort
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

ReadableFile::ReadableFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it is refused below as not a regular file.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw Error(detail::concat("cannot read '", path, "': ", std::strerror(errno)));
  struct stat info {};
  const bool stated = ::fstat(fd_, &info) == 0;
  const int error = errno;
  if (!stated || !S_ISREG(info.st_mode)) {
    ::close(fd_);
    throw Error(detail::concat("cannot read '", path, "': ", stated ? "not a regular file" : std::strerror(error)));
  }
  size_ = static_cast<std::size_t>(info.st_size);
}

ReadableFile::~ReadableFile() { ::close(fd_); }

std::size_t ReadableFile::read_at(std::size_t offset, char* data, std::size_t count) const {
  std::size_t done = 0;
  while (done < count) {
    const ssize_t got = ::pread(fd_, data + done, count - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(detail::concat("cannot read '", path_, "': ", std::strerror(errno)));
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

std::string read_file(const std::string& path) {
  const ReadableFile file(path);
  // Read in place into a buffer of the file's size (growing it, should the file grow meanwhile): appending
  // chunks would copy a large file over and over as the string doubles.
  std::string content(file.size(), '\0');
  std::size_t filled = 0;
  for (;;) {
    if (filled == content.size()) content.resize(std::max<std::size_t>(2 * filled, 1 << 16));
    const std::size_t got = file.read_at(filled, content.data() + filled, content.size() - filled);
    filled += got;
    if (filled < content.size()) {
      content.resize(filled);
      return content;
    }
  }
}

void require_file_target(const std::string& path) {
  CUDNN_CACHE_REQUIRE(!path.empty() && path.back() != '/', "cannot save to '", path, "': give a file name");
  struct stat existing {};
  if (::stat(path.c_str(), &existing) != 0 || S_ISREG(existing.st_mode)) return;
  // rename() would replace a FIFO or a device node (as root, even /dev/null), and fails late on a directory.
  throw Error(detail::concat("cannot save to '", path, "': ",
                             S_ISDIR(existing.st_mode) ? "it is a directory" : "it is not a regular file",
                             "; give the name of a cache file (nothing was written)"));
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  require_file_target(path);
  struct stat existing {};
  const mode_t mode = ::stat(path.c_str(), &existing) == 0 ? (existing.st_mode & 07777) : 0644;
  TemporaryFile temporary(path);
  temporary.write_all(bytes);
  temporary.set_mode(mode);
  temporary.commit();
  sync_folder(folder_of(path));
}

std::string lock_path_of(const std::string& path) { return path + ".lock"; }

FileLock::FileLock(const std::string& path, double timeout_seconds,
                   const std::function<void(const std::string&)>& warn) {
  CUDNN_CACHE_REQUIRE(timeout_seconds >= 0, "cannot save '", path, "': the lock timeout must be >= 0 seconds, got ",
                      timeout_seconds);
  const std::string lock_path = lock_path_of(path);
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int error = errno;
    const char* fix = error == ENOENT   ? " (create its folder first)"
                      : error == EACCES ? " (save into a folder you can write to)"
                                        : "";
    throw Error(detail::concat("cannot save '", path, "': cannot open its lock file '", lock_path, "': ",
                               std::strerror(error), fix, "; the previous file, if any, is unchanged"));
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_seconds));
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      fd_ = fd;
      return;
    }
    const int error = errno;
    if (error == EINTR) continue;
    if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL) {
      ::close(fd);
      const std::string message = detail::concat(
          "cudnn_cache: the file system of '", path, "' does not support locks (flock on '", lock_path,
          "': ", std::strerror(error), "); saving without one: processes saving into it at the same time may "
          "lose each other's entries. Give each process its own file and merge them (python -m cudnn_cache "
          "merge), or use a local file system.");
      if (warn) {
        warn(message);
      } else {
        std::cerr << message << '\n';
      }
      return;
    }
    if (error != EWOULDBLOCK) {
      ::close(fd);
      throw Error(detail::concat("cannot save '", path, "': cannot lock '", lock_path, "': ",
                                 std::strerror(error), "; the previous file, if any, is unchanged"));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      throw Error(detail::concat(
          "cannot save '", path, "': another process has held its lock '", lock_path, "' for more than ",
          timeout_seconds, " s; nothing was written and the file is unchanged. Another cudnn_cache process is "
          "saving into it (or is stuck while saving: `fuser ", lock_path, "` names it). Wait and save again, or "
          "raise the lock timeout (lock_timeout=...)."));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor releases the flock
}

}  // namespace cudnn_cache
