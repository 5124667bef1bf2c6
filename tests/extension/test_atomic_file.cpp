// Whole-file reads and atomic whole-file writes (Note [Atomic save] in atomic_file.h).

#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "cache_fixtures.h"
#include "cudnn_cache/atomic_file.h"

using namespace cudnn_cache;
using Catch::Matchers::Contains;
using cudnn_cache::testing::error_of;
using cudnn_cache::testing::TemporaryFolder;

namespace {

mode_t permissions(const std::string& path) {
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  return info.st_mode & 07777;
}

// Every byte value, NULs and newlines included, a few times over.
std::string every_byte(std::size_t repeats) {
  std::string bytes;
  for (std::size_t r = 0; r < repeats; ++r) {
    for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

// Sets the process umask for the scope of the object.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : previous_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(previous_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t previous_;
};

}  // namespace

TEST_CASE("write_file_atomically then read_file gives back the bytes", "[atomic_file]") {
  TemporaryFolder folder;
  const std::string path = folder.file("data.bin");
  // Larger than read_file's 64 KiB buffer, so several reads are needed.
  for (const std::string& bytes : {std::string(), std::string("x"), every_byte(1), every_byte(1000)}) {
    CAPTURE(bytes.size());
    write_file_atomically(path, bytes);
    CHECK(read_file(path) == bytes);
  }
  CHECK(folder.listing() == std::vector<std::string>{"data.bin"});  // no temporary file left behind
}

TEST_CASE("replacing a file keeps its permission bits", "[atomic_file]") {
  TemporaryFolder folder;
  const std::string path = folder.file("data.bin");
  write_file_atomically(path, "old");
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  write_file_atomically(path, "new");
  CHECK(permissions(path) == 0600);
  CHECK(read_file(path) == "new");
}

TEST_CASE("a new file gets 0644 whatever the umask", "[atomic_file]") {
  TemporaryFolder folder;
  const mode_t mask = GENERATE(mode_t{022}, mode_t{077}, mode_t{0});
  CAPTURE(mask);
  const ScopedUmask scoped(mask);
  const std::string path = folder.file("new.bin");
  write_file_atomically(path, "content");
  CHECK(permissions(path) == 0644);
}

TEST_CASE("read_file names the path it cannot read", "[atomic_file]") {
  TemporaryFolder folder;
  const std::string missing = folder.file("missing.bin");
  CHECK_THAT(error_of([&] { read_file(missing); }), Contains("cannot read '" + missing + "'"));
  CHECK_THAT(error_of([&] { read_file(folder.path()); }),
             Contains("cannot read '" + folder.path() + "'") && Contains("not a regular file"));
}

TEST_CASE("write_file_atomically refuses a path without a file name", "[atomic_file]") {
  TemporaryFolder folder;
  CHECK_THAT(error_of([&] { write_file_atomically(folder.path() + "/", "x"); }), Contains("give a file name"));
  CHECK_THAT(error_of([] { write_file_atomically("", "x"); }), Contains("give a file name"));
  CHECK(folder.listing().empty());
}

TEST_CASE("write_file_atomically refuses to replace a directory or a FIFO, naming what it is", "[atomic_file]") {
  TemporaryFolder folder;
  const std::string directory = folder.file("directory"), fifo = folder.file("fifo");
  REQUIRE(::mkdir(directory.c_str(), 0755) == 0);
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THAT(error_of([&] { write_file_atomically(directory, "x"); }),
             Contains("cannot save to '" + directory + "': it is a directory; give the name of a cache file"));
  CHECK_THAT(error_of([&] { write_file_atomically(fifo, "x"); }),
             Contains("cannot save to '" + fifo + "': it is not a regular file"));
  CHECK(folder.listing() == std::vector<std::string>{"directory", "fifo"});  // no temporary file either
  CHECK_NOTHROW(require_file_target(folder.file("new.bin")));
}

TEST_CASE("write_file_atomically into a missing folder names the path and changes nothing", "[atomic_file]") {
  TemporaryFolder folder;
  const std::string path = folder.file("missing/data.bin");
  CHECK_THAT(error_of([&] { write_file_atomically(path, "x"); }),
             Contains("cannot save '" + path + "'") && Contains("unchanged"));
  CHECK(folder.listing().empty());
}

// --- Locks (Note [Shared cache files]) -------------------------------------------------------------------------

TEST_CASE("a file's lock excludes a second holder until released, then is granted", "[atomic_file][lock]") {
  TemporaryFolder folder;
  const std::string path = folder.file("shared.bin");
  CHECK(lock_path_of(path) == path + ".lock");
  {
    const FileLock first(path, 1.0);
    CHECK(first.held());
    // flock locks belong to the open file, so a second lock in the same process waits like another process.
    const std::string message = error_of([&] { FileLock second(path, 0.05); });
    CHECK_THAT(message, Contains("'" + path + "'") && Contains(path + ".lock") && Contains("0.05 s") &&
                            Contains("lock_timeout") && Contains("unchanged"));
  }
  const FileLock again(path, 0.0);  // released with the first: granted at once
  CHECK(again.held());
  CHECK(folder.listing() == std::vector<std::string>{"shared.bin.lock"});
}

TEST_CASE("a lock that cannot be made, or a negative timeout, is refused naming the file", "[atomic_file][lock]") {
  TemporaryFolder folder;
  const std::string path = folder.file("no/such/folder/shared.bin");
  CHECK_THAT(error_of([&] { FileLock lock(path, 1.0); }),
             Contains(path + ".lock") && Contains("No such file or directory"));
  CHECK_THAT(error_of([&] { FileLock lock(folder.file("x.bin"), -1.0); }), Contains("must be >= 0"));
}
