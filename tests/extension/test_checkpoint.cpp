// Cache files: round trips, load reports, merging loads, the header, and rejection of every kind of damage
// with the store left as it was (checkpoint.h, Note [Atomic save] in atomic_file.h).

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "cache_fixtures.h"
#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/synthetic.h"

using namespace cudnn_cache;
using Catch::Matchers::Contains;
using cudnn_cache::testing::attention_key;
using cudnn_cache::testing::candidate;
using cudnn_cache::testing::conv_key;
using cudnn_cache::testing::difference;
using cudnn_cache::testing::engine;
using cudnn_cache::testing::error_of;
using cudnn_cache::testing::failure;
using cudnn_cache::testing::TemporaryFolder;

namespace {

using Fwd = ForwardTraits;
using BwdData = BackwardDataTraits;
using BwdFilter = BackwardFilterTraits;

constexpr std::size_t kVersionOffset = 9;  // after the endianness flag and the magic

const CudnnVersion kRunning{9, 19, 0};

Origin running_origin() { return Origin::of(DeviceIdentity{"Test GPU", 9, 0, 132}, kRunning); }
// Another device, measured with another cuDNN minor.
Origin other_cudnn_origin() {
  return Origin::of(DeviceIdentity{"Older GPU", 8, 0, 108}, CudnnVersion{kRunning.major, kRunning.minor + 1, 0});
}

// A few entries synthetic ones would not make: failures, math types, channels-last, several directions.
void add_handcrafted_entries(CacheStore& store, const Origin& origin) {
  DirectionCaches& caches = store.caches(origin);
  caches.forward.insert(
      conv_key(Direction::forward, 3, 5, Layout::nhwc, CUDNN_DATA_HALF),
      Ranking<Fwd>::of({candidate<Fwd>(1, 0.125f, 1u << 20, CUDNN_STATUS_SUCCESS, CUDNN_TENSOR_OP_MATH),
                        candidate<Fwd>(6, 0.5f), failure<Fwd>(4)}));
  caches.backward_data.insert(conv_key(Direction::backward_data, 2, 4, Layout::nchw, CUDNN_DATA_DOUBLE),
                              Ranking<BwdData>::of({failure<BwdData>(0), failure<BwdData>(1, CUDNN_FMA_MATH)}));
  caches.backward_filter.insert(conv_key(Direction::backward_filter, 1, 16),
                                Ranking<BwdFilter>::of({candidate<BwdFilter>(3, 7.5f, std::uint64_t{1} << 40)}));
}

// Two origins, one of them measured with another cuDNN minor; synthetic entries plus handcrafted ones.
void fill(CacheStore& store, std::size_t synthetic_entries, std::uint64_t seed = 1) {
  add_synthetic_entries(store, running_origin(), synthetic_entries, seed);
  add_synthetic_entries(store, other_cudnn_origin(), synthetic_entries / 2, seed + 1);
  add_handcrafted_entries(store, running_origin());
  add_handcrafted_entries(store, other_cudnn_origin());
}

std::size_t entries_of(const CacheStore& store, const Origin& origin) {
  const DirectionCaches* caches = store.find(origin);
  return caches ? caches->size() : 0;
}

// A plain, non-atomic write, for damaged files (no fsync: these tests write thousands of them).
void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void put_u32(std::string& bytes, std::size_t offset, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

std::uint32_t get_u32(const std::string& bytes, std::size_t offset) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= std::uint32_t{static_cast<unsigned char>(bytes[offset + i])} << (8 * i);
  return value;
}

// Checks damaged bytes the way a user meets them: deserialize must reject them with an Error naming the source
// and saying one of `reasons`, and load() of them as a file must throw and leave a pre-filled store unchanged.
// The store is filled with other entries than the file's, so a load that wrongly succeeded would change it.
class RejectionChecker {
 public:
  RejectionChecker() {
    fill(store_, 10, /*seed=*/99);
    before_ = snapshot(store_);
    origins_before_ = store_.origins().size();
  }

  void check(const std::string& bytes, const std::vector<std::string>& reasons) {
    const std::string message = error_of([&] { deserialize(bytes, "damaged.bin"); });
    INFO("deserialize said: " << message);
    CHECK_THAT(message, Contains("'damaged.bin'"));
    CHECK(says_one_of(message, reasons));

    const std::string path = folder_.file("damaged.bin");
    write_plain(path, bytes);
    const std::string load_message = error_of([&] { load(store_, path, kRunning); });
    INFO("load said: " << load_message);
    CHECK_THAT(load_message, Contains(path));
    CHECK(difference(before_, snapshot(store_)) == "");
    CHECK(store_.origins().size() == origins_before_);  // not even an empty origin was added
  }

 private:
  static bool says_one_of(const std::string& message, const std::vector<std::string>& reasons) {
    return std::any_of(reasons.begin(), reasons.end(),
                       [&](const std::string& reason) { return message.find(reason) != std::string::npos; });
  }

  TemporaryFolder folder_;
  CacheStore store_;
  Checkpoint before_;
  std::size_t origins_before_ = 0;
};

// The bytes of a small valid file.
std::string small_file_bytes() {
  CacheStore store;
  add_synthetic_entries(store, running_origin(), 20);
  return serialize(snapshot(store));
}

}  // namespace

// --- Round trips ---------------------------------------------------------------------------------------------

TEST_CASE("save then load gives back every entry of every origin", "[checkpoint]") {
  TemporaryFolder folder;
  CacheStore original;
  fill(original, 300);
  const std::string path = folder.file("cache.bin");
  save(original, path);

  CacheStore loaded;
  const LoadReport report = load(loaded, path, kRunning);
  const Checkpoint expected = snapshot(original);
  REQUIRE(expected.sections.size() == 2);
  CHECK(difference(expected, snapshot(loaded)) == "");
  CHECK(report.entries == original.size());
  CHECK(report.header.format_version == kFormatVersion);
  CHECK(report.header.cudnn_version == CudnnVersion::of_library().number());
  CHECK(report.header.cuda_runtime_version == cuda_runtime_version());

  SECTION("entries of another cuDNN are counted, kept, and saved again") {
    const std::size_t other = entries_of(original, other_cudnn_origin());
    REQUIRE(other > 0);
    CHECK(report.other_cudnn_entries == other);
    CHECK(entries_of(loaded, other_cudnn_origin()) == other);

    const std::string again = folder.file("again.bin");
    save(loaded, again);
    CHECK(difference(expected, read_checkpoint(again)) == "");
  }
  SECTION("the report counts against the cuDNN it is given") {
    CacheStore store;
    const CudnnVersion other_release{kRunning.major, kRunning.minor + 1, 3};
    CHECK(load(store, path, other_release).other_cudnn_entries == entries_of(original, running_origin()));
  }
}

TEST_CASE("a store round-trips through serialize and deserialize without a file", "[checkpoint]") {
  CacheStore store;
  fill(store, 50);
  const Checkpoint expected = snapshot(store);
  const Checkpoint parsed = deserialize(serialize(expected), "memory");
  CHECK(difference(expected, parsed) == "");
  CHECK(parsed.size() == store.size());
}

TEST_CASE("loading into a non-empty store merges by the merge rule", "[checkpoint]") {
  TemporaryFolder folder;
  const Origin origin = running_origin();
  const ConvolutionKey shared = conv_key(Direction::forward, 1);
  const ConvolutionKey only_in_store = conv_key(Direction::forward, 2);
  const ConvolutionKey only_in_file = conv_key(Direction::forward, 3);
  const auto in_store = Ranking<Fwd>::of({candidate<Fwd>(1, 5.0f), candidate<Fwd>(2, 0.5f), failure<Fwd>(3)});
  const auto in_file =
      Ranking<Fwd>::of({candidate<Fwd>(1, 1.0f), candidate<Fwd>(3, 2.0f), candidate<Fwd>(2, 0.5f, 64)});

  CacheStore writer;
  writer.caches(origin).forward.insert(shared, in_file);
  writer.caches(origin).forward.insert(only_in_file, in_file);
  save(writer, folder.file("cache.bin"));

  CacheStore store;
  store.caches(origin).forward.insert(shared, in_store);
  store.caches(origin).forward.insert(only_in_store, in_store);
  load(store, folder.file("cache.bin"), kRunning);

  const PerfCache<Fwd>& cache = store.caches(origin).forward;
  CHECK(cache.size() == 3);
  REQUIRE(cache.find(only_in_store));
  CHECK(*cache.find(only_in_store) == in_store);
  REQUIRE(cache.find(only_in_file));
  CHECK(*cache.find(only_in_file) == in_file);
  const auto merged = cache.find(shared);
  REQUIRE(merged != nullptr);
  INFO(testing::to_text(*merged));
  CHECK(*merged == merge(in_store, in_file));
  // Algorithm 2 ties on time: the store's smaller workspace wins; 1 takes the file's faster time; 3 succeeded.
  CHECK(*merged == Ranking<Fwd>::of({candidate<Fwd>(2, 0.5f), candidate<Fwd>(1, 1.0f), candidate<Fwd>(3, 2.0f)}));
}

// --- Header --------------------------------------------------------------------------------------------------

TEST_CASE("the header starts with the magic and carries the versions", "[checkpoint]") {
  Checkpoint checkpoint;
  checkpoint.header.cudnn_version = 81204;
  checkpoint.header.cuda_runtime_version = 12080;
  const std::string bytes = serialize(checkpoint);
  REQUIRE(bytes.size() > kVersionOffset + 4);
  CHECK(bytes[0] == '\x01');
  CHECK(bytes.substr(1, kMagic.size()) == "CDNNCACH");
  CHECK(get_u32(bytes, kVersionOffset) == kFormatVersion);

  const Checkpoint parsed = deserialize(bytes, "memory");
  CHECK(parsed.header.format_version == kFormatVersion);
  CHECK(parsed.header.cudnn_version == 81204);
  CHECK(parsed.header.cuda_runtime_version == 12080);
  CHECK(parsed.sections.empty());

  const Checkpoint stamped = snapshot(CacheStore());
  CHECK(stamped.header.cudnn_version == CudnnVersion::of_library().number());
  CHECK(stamped.header.cuda_runtime_version == cuda_runtime_version());
}

// --- Damaged files -------------------------------------------------------------------------------------------

TEST_CASE("every truncation of a file is rejected and loads nothing", "[checkpoint]") {
  const std::string bytes = small_file_bytes();
  RejectionChecker checker;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n, bytes.size());
    checker.check(bytes.substr(0, n), {"truncated", "corrupt"});
  }
}

TEST_CASE("1000 random single-bit flips are each rejected and load nothing", "[checkpoint]") {
  const std::string bytes = small_file_bytes();
  RejectionChecker checker;
  std::mt19937 random(20240601);
  std::uniform_int_distribution<std::size_t> byte(0, bytes.size() - 1);
  std::uniform_int_distribution<int> bit(0, 7);
  for (int flip = 0; flip < 1000; ++flip) {
    std::string damaged = bytes;
    const std::size_t offset = byte(random);
    const int mask = 1 << bit(random);
    damaged[offset] = static_cast<char>(damaged[offset] ^ mask);
    CAPTURE(flip, offset, mask);
    checker.check(damaged, {"truncated", "corrupt", "wrong magic", "newer"});
  }
}

// A file is read through a 1 MB buffer, checked in one pass and parsed in a second: a file of several buffers
// must load whole, and damage in any buffer must be found.
TEST_CASE("a file of several read buffers loads whole, and damage past the first buffer is rejected",
          "[checkpoint]") {
  TemporaryFolder folder;
  CacheStore original;
  fill(original, 8000);
  const std::string path = folder.file("large.bin");
  save(original, path);
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() > 3 * (std::size_t{1} << 20));
  CHECK(difference(snapshot(original), read_checkpoint(path)) == "");
  CHECK(difference(deserialize(bytes, path), read_checkpoint(path)) == "");
  CacheStore loaded;
  CHECK(load(loaded, path, kRunning).entries == original.size());

  RejectionChecker checker;
  SECTION("a flipped bit in the third megabyte") {
    std::string damaged = bytes;
    damaged[(std::size_t{5} << 19) + 3] ^= 0x10;
    checker.check(damaged, {"checksum mismatch"});
  }
  SECTION("a flipped bit in the checksum itself") {
    std::string damaged = bytes;
    damaged[bytes.size() - 2] ^= 0x01;
    checker.check(damaged, {"checksum mismatch"});
  }
  SECTION("cut in the second megabyte") { checker.check(bytes.substr(0, (std::size_t{3} << 19) + 5), {"truncated"}); }
  SECTION("cut at a buffer's end") { checker.check(bytes.substr(0, std::size_t{2} << 20), {"truncated"}); }
}

TEST_CASE("a file with the wrong magic is rejected", "[checkpoint]") {
  RejectionChecker checker;
  std::string bytes = small_file_bytes();
  SECTION("another magic") { bytes[3] = 'X'; }
  SECTION("a big-endian flag") { bytes[0] = '\0'; }
  SECTION("not a cache file at all") { bytes = "# some text file\n"; }
  checker.check(bytes, {"not a cudnn_cache file (wrong magic)"});
}

TEST_CASE("a file of a newer format is rejected before its checksum is checked", "[checkpoint]") {
  std::string bytes = small_file_bytes();
  put_u32(bytes, kVersionOffset, kFormatVersion + 1);
  RejectionChecker checker;
  checker.check(bytes, {"newer"});
  CHECK_THAT(error_of([&] { deserialize(bytes, "x"); }), Contains("file format " + std::to_string(kFormatVersion + 1)));
}

TEST_CASE("a file of format version 0 is rejected", "[checkpoint]") {
  std::string bytes = small_file_bytes();
  put_u32(bytes, kVersionOffset, 0);
  RejectionChecker().check(bytes, {"corrupt"});
}

TEST_CASE("bytes after the checksum are rejected", "[checkpoint]") {
  RejectionChecker().check(small_file_bytes() + "garbage", {"corrupt: 7 unexpected bytes"});
}

TEST_CASE("loading a missing file names it", "[checkpoint]") {
  TemporaryFolder folder;
  CacheStore store;
  const std::string path = folder.file("missing.bin");
  CHECK_THAT(error_of([&] { load(store, path, kRunning); }), Contains(path));
  CHECK(store.origins().empty());
}

// The checksum only proves the bytes are as written; what they say must still be checked.
TEST_CASE("a file with a valid checksum but an invalid entry is rejected", "[checkpoint]") {
  CacheStore store;
  add_synthetic_entries(store, running_origin(), 5);
  add_synthetic_entries(store, other_cudnn_origin(), 5);
  Checkpoint checkpoint = snapshot(store);
  REQUIRE(checkpoint.sections.size() == 2);
  CheckpointSection& section = checkpoint.sections[0];
  const ConvolutionKey key = conv_key(Direction::forward);
  const auto ranking = Ranking<Fwd>::of({candidate<Fwd>(0, 1.0f)});
  section.forward.assign(2, {key, ranking});
  std::string reason;

  SECTION("a key of rank 9") {
    section.forward.resize(1);
    section.forward[0].first.input.nb_dims = 9;
    reason = "rank 9";
  }
  SECTION("a key that check_key refuses") {
    section.forward.resize(1);
    section.forward[0].first.convolution.padding[0] = 5;  // the output size no longer matches
    reason = "does not match";
  }
  SECTION("a key of another direction") {
    section.forward.resize(1);
    section.forward[0].first.direction = static_cast<std::int32_t>(Direction::backward_data);
    reason = "another direction";
  }
  SECTION("a repeated key") { reason = "out of order or repeated"; }
  SECTION("sections out of order") {
    std::swap(checkpoint.sections[0], checkpoint.sections[1]);
    reason = "section 1 is out of order";
  }
  CAPTURE(reason);
  RejectionChecker().check(serialize(checkpoint), {"corrupt"});
  CHECK_THAT(error_of([&] { deserialize(serialize(checkpoint), "forged.bin"); }),
             Contains("'forged.bin' is corrupt") && Contains(reason));
}

// cudnnStatus_t cannot hold every int32 (serialization.h), so a stored status outside its range is refused
// before it is cast. The payload is patched by hand: no Candidate can carry such a status to serialize.
TEST_CASE("a file with a valid checksum but a status no cudnnStatus_t can hold is rejected", "[checkpoint]") {
  CacheStore store;
  store.caches(running_origin()).forward.insert(
      conv_key(Direction::forward),
      Ranking<Fwd>::of({candidate<Fwd>(2, 1.0f), candidate<Fwd>(1, 0.0f, 0, CUDNN_STATUS_EXECUTION_FAILED_CURAND)}));
  const Checkpoint checkpoint = snapshot(store);
  const std::string bytes = serialize(checkpoint);
  constexpr std::size_t kHeader = 29, kChecksum = 8;
  std::string payload = bytes.substr(kHeader, bytes.size() - kHeader - kChecksum);
  REQUIRE(frame_payload(checkpoint.header, payload) == bytes);
  std::string status(4, '\0');
  put_u32(status, 0, CUDNN_STATUS_EXECUTION_FAILED_CURAND);
  const std::size_t at = payload.find(status);
  REQUIRE(at != std::string::npos);
  REQUIRE(payload.find(status, at + 1) == std::string::npos);
  const std::uint32_t value = GENERATE(std::uint32_t{1} << 13, std::uint32_t{1} << 24, 0xffffffffu);
  put_u32(payload, at, value);
  CHECK_THAT(error_of([&] { deserialize(frame_payload(checkpoint.header, payload), "forged.bin"); }),
             Contains("'forged.bin' is corrupt") &&
                 Contains("cuDNN status " + std::to_string(static_cast<std::int32_t>(value))));
  put_u32(payload, at, (1 << 13) - 1);  // within the range: a status this cuDNN does not name, kept as a failure
  const Checkpoint read = deserialize(frame_payload(checkpoint.header, payload), "unknown status.bin");
  CHECK_FALSE(read.sections[0].forward[0].second[1].succeeded());
}

// A device name with a NUL in it loaded, but its JSON export imported with the name cut at the NUL (the fuzzer).
TEST_CASE("a file with a valid checksum but a device name that is not printable ASCII is rejected", "[checkpoint]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  const Checkpoint checkpoint = snapshot(store);
  const std::string bytes = serialize(checkpoint);
  std::string payload = bytes.substr(29, bytes.size() - 29 - 8);
  const std::size_t at = payload.find("Test GPU");
  REQUIRE(at != std::string::npos);
  const char replacement = GENERATE('\0', '\n', '\x7f', '\xb7');
  payload[at + 4] = replacement;
  CAPTURE(static_cast<int>(replacement));
  CHECK_THAT(error_of([&] { deserialize(frame_payload(checkpoint.header, payload), "forged.bin"); }),
             Contains("'forged.bin' is corrupt") && Contains("device name that is not printable ASCII"));
  CacheStore named;
  named.caches(Origin::of(DeviceIdentity{std::string("Test\0GPU", 8), 9, 0, 132}, kRunning))
      .forward.insert(conv_key(Direction::forward), Ranking<Fwd>::of({candidate<Fwd>(0, 1.0f)}));
  CHECK_THAT(error_of([&] { serialize(snapshot(named)); }), Contains("not printable ASCII"));
}

// cudnnFind*AlgorithmEx reports a time of -1 for the algorithms that failed (NOT_SUPPORTED, ALLOC_FAILED...);
// Runtime::search caches its ranking, failures included (Candidate::from_perf stores their time as 0). Such a
// cache must load again.
TEST_CASE("a ranking as cuDNN reports it, failures with time -1 included, survives save and load",
          "[checkpoint]") {
  TemporaryFolder folder;
  cudnnConvolutionFwdAlgoPerf_t perfs[2]{};
  perfs[0] = {
      CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_STATUS_SUCCESS, 0.5f, 0, CUDNN_DETERMINISTIC, CUDNN_DEFAULT_MATH, {}};
  perfs[1] = {CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_STATUS_NOT_SUPPORTED, -1.0f, 0,
              CUDNN_NON_DETERMINISTIC,        CUDNN_DEFAULT_MATH,         {}};
  CacheStore store;
  store.caches(running_origin()).forward.insert(conv_key(Direction::forward), Ranking<Fwd>::of_perfs(perfs, 2));
  const std::string path = folder.file("cache.bin");
  save(store, path);
  CacheStore loaded;
  CHECK_NOTHROW(load(loaded, path, kRunning));
  CHECK(difference(snapshot(store), snapshot(loaded)) == "");
}

// --- Saving --------------------------------------------------------------------------------------------------

TEST_CASE("a save that fails midway leaves the old file", "[checkpoint]") {
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  CacheStore old_store;
  fill(old_store, 20);
  save(old_store, path);
  CacheStore big_store;
  add_synthetic_entries(big_store, running_origin(), 5000);
  REQUIRE(serialize(snapshot(big_store)).size() > 4096 * 4);

  constexpr int kThrewUnchanged = 42, kThrewOther = 43, kSucceeded = 44, kOtherException = 45;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no Catch2 in here: only async-safe-ish work and _exit
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int code = kSucceeded;
    try {
      save(big_store, path);
    } catch (const Error& e) {
      code = std::strstr(e.what(), "unchanged") ? kThrewUnchanged : kThrewOther;
    } catch (...) {
      code = kOtherException;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kThrewUnchanged);

  CHECK(difference(snapshot(old_store), read_checkpoint(path)) == "");
  // No ".cache.bin.tmp.*" left; the lock file stays (Note [Shared cache files]).
  CHECK(folder.listing() == std::vector<std::string>{"cache.bin", "cache.bin.lock"});
}

TEST_CASE("saving into a missing folder names the path and keeps the previous file", "[checkpoint]") {
  TemporaryFolder folder;
  CacheStore store;
  fill(store, 5);
  const std::string path = folder.file("no/such/folder/cache.bin");
  CHECK_THAT(error_of([&] { save(store, path); }),
             Contains(path) && Contains("the previous file, if any, is unchanged"));
  CHECK(folder.listing().empty());
}

TEST_CASE("saving over a directory says so, merging or not, and creates no lock file next to it", "[checkpoint]") {
  TemporaryFolder folder;
  const std::string path = folder.file("taken");
  REQUIRE(::mkdir(path.c_str(), 0755) == 0);
  CacheStore store;
  fill(store, 5);
  SaveOptions options;
  options.merge = GENERATE(true, false);
  CAPTURE(options.merge);
  const std::string message = error_of([&] { save(store, path, options); });
  CHECK_THAT(message, Contains("cannot save to '" + path + "': it is a directory; give the name of a cache file"));
  CHECK_THAT(message, !Contains("merge=False"));  // which cannot replace a directory either
  CHECK(folder.listing() == std::vector<std::string>{"taken"});
}

TEST_CASE("saving over an existing file replaces it when merging is off", "[checkpoint]") {
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  CacheStore first, second;
  fill(first, 10, 1);
  fill(second, 10, 2);
  save(first, path);
  SaveOptions replace;
  replace.merge = false;
  const SaveReport report = save(second, path, replace);
  CHECK(difference(snapshot(second), read_checkpoint(path)) == "");
  CHECK(report.entries == second.size());
  CHECK(report.file_entries == 0);
  CHECK(folder.listing() == std::vector<std::string>{"cache.bin", "cache.bin.lock"});
}

// --- Format versions and the graph API's entries ---------------------------------------------------------------

namespace {


using GraphFwd = GraphForwardTraits;

}  // namespace

TEST_CASE("engine configs round-trip with their knobs, next to the legacy entries", "[checkpoint][graph]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  EngineCandidate compiled = engine(0, 1.9f);
  compiled.behavior_notes = EngineCandidate::kRuntimeCompiled;
  EngineCandidate split = engine(22, 0.06f, {{2, 16}, {13, 0}, {14, 3}});
  split.numerical_notes = EngineCandidate::kNondeterministic | (1 << 1);  // and TENSOR_CORE
  const auto ranking = Ranking<GraphFwd>::of({engine(71, 0.02f), split, compiled});
  store.caches(running_origin()).graph_forward.insert(conv_key(Direction::forward), ranking);
  const Checkpoint written = snapshot(store);
  REQUIRE(written.header.format_version == kFormatVersion);
  const Checkpoint read = deserialize(serialize(written), "graph.bin");
  CHECK(difference(written, read) == "");
  REQUIRE(read.sections[0].graph_forward.size() == 1);
  const auto& loaded = read.sections[0].graph_forward[0].second;
  CHECK(loaded == ranking);
  CHECK(to_string(loaded[1]) == "engine 22 (k2=16, k13=0, k14=3) nondeterministic");
  CHECK(to_string(loaded[2]) == "engine 0 runtime-compiled");
  CHECK(loaded[1].numerical_notes == split.numerical_notes);
  CHECK_FALSE(loaded[1].deterministic());
  CHECK(loaded[0].deterministic());
}

TEST_CASE("a graph search's 18 timed configs are all kept, and round-trip", "[checkpoint][graph]") {
  // The default search times up to 10 + 3 + 4 configs and heuristics' first pick; a ranking used to keep 8.
  std::vector<EngineCandidate> timed;
  for (int i = 0; i < 18; ++i) timed.push_back(engine(i, 0.01f * static_cast<float>(i + 1)));
  const auto ranking = Ranking<GraphFwd>::of(timed.begin(), timed.end());
  REQUIRE(ranking.size() == 18);
  CacheStore store;
  store.caches(running_origin()).graph_forward.insert(conv_key(Direction::forward), ranking);
  const Checkpoint read = deserialize(serialize(snapshot(store)), "graph.bin");
  REQUIRE(read.sections[0].graph_forward.size() == 1);
  CHECK(read.sections[0].graph_forward[0].second == ranking);
}

TEST_CASE("a version-1 file, which has no graph entries, still loads", "[checkpoint][graph]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  Checkpoint checkpoint = snapshot(store);
  for (auto& section : checkpoint.sections) {
    section.graph_forward.clear();
    section.graph_backward_data.clear();
    section.graph_backward_filter.clear();
  }
  REQUIRE(checkpoint.size() > 0);
  checkpoint.header.format_version = 1;
  const std::string bytes = serialize(checkpoint);
  CHECK(get_u32(bytes, 9) == 1);
  const Checkpoint read = deserialize(bytes, "old.bin");
  CHECK(read.header.format_version == 1);
  CHECK(difference(checkpoint, read) == "");
}

TEST_CASE("format 1 cannot be written with graph entries", "[checkpoint][graph]") {
  CacheStore store;
  store.caches(running_origin()).graph_backward_filter.insert(conv_key(Direction::backward_filter),
                                                              Ranking<GraphBackwardFilterTraits>::of({engine(3, 1.0f)}));
  Checkpoint checkpoint = snapshot(store);
  checkpoint.header.format_version = 1;
  CHECK_THAT(error_of([&] { serialize(checkpoint); }), Contains("cannot hold graph-API entries"));
}

TEST_CASE("a file with a valid checksum but an invalid engine config is rejected", "[checkpoint][graph]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  Checkpoint checkpoint = snapshot(store);
  EngineCandidate bad = engine(5, 1.0f, {{4, 1}, {9, 2}});
  std::string reason;
  SECTION("a negative engine id") {
    bad.engine_id = -3;
    reason = "engine id -3";
  }
  SECTION("knobs out of order") {
    std::swap(bad.knobs[0], bad.knobs[1]);
    reason = "knob types";
  }
  SECTION("a negative time") {
    bad.time_ms = -1.0f;
    reason = "time -1";
  }
  SECTION("negative behavior notes") {
    bad.behavior_notes = -8;
    reason = "behavior notes -8";
  }
  SECTION("numerical notes below 'unknown' (-1)") {
    bad.numerical_notes = -2;
    reason = "numerical notes -2";
  }
  // Built by hand: Ranking::of would not check what the loader must.
  std::array<EngineCandidate, 1> one{bad};
  checkpoint.sections[0].graph_forward = {{conv_key(Direction::forward),
                                           Ranking<GraphFwd>::of(one.begin(), one.end())}};
  CAPTURE(reason);
  CHECK_THAT(error_of([&] { deserialize(serialize(checkpoint), "forged.bin"); }),
             Contains("'forged.bin' is corrupt") && Contains(reason));
}

namespace {

// A stored plan of `size` bytes of a runtime-compiled config.
StoredPlan stored_plan(std::size_t size, std::uint32_t cudnn_version = 91900) {
  StoredPlan plan;
  plan.config = engine(71, 0.25f, {{2, 16}, {13, 1}});
  plan.config.behavior_notes = EngineCandidate::kRuntimeCompiled;
  plan.cudnn_version = cudnn_version;
  plan.bytes.resize(size);
  for (std::size_t i = 0; i < size; ++i) plan.bytes[i] = static_cast<std::uint8_t>(i * 131 + 7);
  return plan;
}

}  // namespace

TEST_CASE("stored plans round-trip next to the entries, and a load reports them", "[checkpoint][plans]") {
  TemporaryFolder folder;
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  DirectionCaches& caches = store.caches(running_origin());
  caches.plans.insert(conv_key(Direction::forward, 3, 5, Layout::nhwc, CUDNN_DATA_BFLOAT16), stored_plan(56718));
  caches.plans.insert(conv_key(Direction::backward_data, 3, 5), stored_plan(1, 91901));
  store.caches(other_cudnn_origin()).plans.insert(conv_key(Direction::backward_filter, 2, 2), stored_plan(300));
  const std::string path = folder.path() + "/plans.cache";
  save(store, path);
  CacheStore loaded;
  const LoadReport report = load(loaded, path, kRunning);
  CHECK(report.header.format_version == kFormatVersion);
  CHECK(report.plans == 3);
  CHECK(difference(snapshot(store), snapshot(loaded)) == "");
  const auto plan = loaded.caches(running_origin()).plans.find(conv_key(Direction::backward_data, 3, 5));
  REQUIRE(plan != nullptr);
  CHECK(plan->cudnn_version == 91901);
  CHECK(plan->config.same_choice(stored_plan(1).config));
}

TEST_CASE("a version-2 file, which has no stored plans, still loads", "[checkpoint][plans]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  store.caches(running_origin()).graph_forward.insert(conv_key(Direction::forward),
                                                      Ranking<GraphFwd>::of({engine(3, 1.0f)}));
  Checkpoint checkpoint = snapshot(store);
  checkpoint.header.format_version = 2;
  const std::string bytes = serialize(checkpoint);
  CHECK(get_u32(bytes, kVersionOffset) == 2);
  const Checkpoint read = deserialize(bytes, "v2.bin");
  CHECK(read.header.format_version == 2);
  CHECK(difference(checkpoint, read) == "");
}

TEST_CASE("format 2 cannot be written with stored plans", "[checkpoint][plans]") {
  CacheStore store;
  store.caches(running_origin()).plans.insert(conv_key(Direction::forward), stored_plan(10));
  Checkpoint checkpoint = snapshot(store);
  REQUIRE(checkpoint.sections.size() == 1);  // a section with plans only is still written
  checkpoint.header.format_version = 2;
  CHECK_THAT(error_of([&] { serialize(checkpoint); }), Contains("cannot hold stored plans"));
}

TEST_CASE("pending keys survive a save and load, merge with a store's, and drop out once cached",
          "[checkpoint][pending]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  DirectionCaches& caches = store.caches(running_origin());
  const ConvolutionKey graph_key = conv_key(Direction::forward, 21), legacy_key = conv_key(Direction::backward_data, 22);
  caches.pending.insert(true, graph_key);
  caches.pending.insert(true, graph_key);  // kept once
  caches.pending.insert(false, legacy_key);
  const Checkpoint written = snapshot(store);
  REQUIRE(written.pending() == 2);
  const Checkpoint read = deserialize(serialize(written), "pending.bin");
  CHECK(difference(written, read) == "");
  CHECK(read.sections[0].pending_graph == std::vector<ConvolutionKey>{graph_key});
  CHECK(read.sections[0].pending_legacy == std::vector<ConvolutionKey>{legacy_key});

  // Merged into another store, with a pending key of its own: both are pending there.
  CacheStore other;
  const ConvolutionKey own = conv_key(Direction::backward_filter, 23);
  other.caches(running_origin()).pending.insert(true, own);
  merge_into(other, read);
  CHECK(other.caches(running_origin()).pending_keys(true) == std::vector<ConvolutionKey>{graph_key, own});
  // Once the graph key is cached it is no longer pending: not listed, not saved. The legacy cache holding it
  // does not make it cached for the graph API.
  other.caches(running_origin()).forward.insert(graph_key, Ranking<ForwardTraits>::of({candidate<ForwardTraits>(1, 0.5f)}));
  CHECK(other.caches(running_origin()).pending_keys(true) == std::vector<ConvolutionKey>{graph_key, own});
  other.caches(running_origin()).graph_forward.insert(graph_key, Ranking<GraphFwd>::of({engine(3, 1.0f)}));
  CHECK(other.caches(running_origin()).pending_keys(true) == std::vector<ConvolutionKey>{own});
  CHECK(snapshot(other).sections[0].pending_graph == std::vector<ConvolutionKey>{own});
  // A section that holds pending keys only is still written.
  CacheStore only;
  only.caches(running_origin()).pending.insert(false, legacy_key);
  CHECK(deserialize(serialize(snapshot(only)), "only.bin").pending() == 1);
}

TEST_CASE("format 3 cannot be written with pending keys", "[checkpoint][pending]") {
  CacheStore store;
  store.caches(running_origin()).pending.insert(true, conv_key(Direction::forward));
  Checkpoint checkpoint = snapshot(store);
  checkpoint.header.format_version = 3;
  CHECK_THAT(error_of([&] { serialize(checkpoint); }), Contains("file format 3 cannot hold pending keys"));
}

TEST_CASE("a file with a valid checksum but an invalid stored plan is rejected", "[checkpoint][plans]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  Checkpoint checkpoint = snapshot(store);
  auto& plans = checkpoint.sections[0].plans;
  std::string reason;
  SECTION("an empty plan") {
    plans = {{conv_key(Direction::forward), std::make_shared<const StoredPlan>(stored_plan(0))}};
    reason = "stored plan of 0 bytes";
  }
  SECTION("a plan larger than the limit") {
    plans = {{conv_key(Direction::forward), std::make_shared<const StoredPlan>(stored_plan(kMaxStoredPlanBytes + 1))}};
    reason = "stored plan of";
  }
  SECTION("plans out of order") {
    plans = {{conv_key(Direction::forward, 2, 2), std::make_shared<const StoredPlan>(stored_plan(4))},
             {conv_key(Direction::forward, 1, 1), std::make_shared<const StoredPlan>(stored_plan(4))}};
    reason = "out of order";
  }
  SECTION("an invalid key") {
    ConvolutionKey key = conv_key(Direction::forward);
    key.input.nb_dims = 9;
    plans = {{key, std::make_shared<const StoredPlan>(stored_plan(4))}};
    reason = "stored plan 0";
  }
  CAPTURE(reason);
  CHECK_THAT(error_of([&] { deserialize(serialize(checkpoint), "forged.bin"); }),
             Contains("'forged.bin' is corrupt") && Contains(reason));
}

TEST_CASE("attention plans round-trip through a file and a JSON export, and a load reports them",
          "[checkpoint][attention]") {
  TemporaryFolder folder;
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  DirectionCaches& caches = store.caches(running_origin());
  caches.attention.insert(attention_key(AttentionDirection::forward), stored_plan(3000));
  AttentionKey dropout = attention_key(AttentionDirection::backward, 4, 77);
  dropout.set_dropout_probability(0.1f);
  dropout.is_causal = 1;
  caches.attention.insert(dropout, stored_plan(12, 91901));
  store.caches(other_cudnn_origin()).attention.insert(attention_key(AttentionDirection::forward, 1, 9), stored_plan(5));
  const std::string path = folder.path() + "/attention.cache";
  save(store, path);
  CacheStore loaded;
  const LoadReport report = load(loaded, path, kRunning);
  CHECK(report.plans == 3);
  CHECK(difference(snapshot(store), snapshot(loaded)) == "");
  const auto plan = loaded.caches(running_origin()).attention.find(dropout);
  REQUIRE(plan != nullptr);
  CHECK(plan->cudnn_version == 91901);
  CHECK(plan->bytes == stored_plan(12).bytes);
  CHECK(loaded.caches(running_origin()).attention.find(attention_key(AttentionDirection::backward)) == nullptr);

  const Checkpoint checkpoint = snapshot(store);
  CHECK(difference(checkpoint, from_json(to_json(checkpoint), "export.json")) == "");
}

TEST_CASE("a merging save keeps the file's attention plans and replaces those the store has again",
          "[checkpoint][attention]") {
  TemporaryFolder folder;
  const std::string path = folder.path() + "/shared.cache";
  CacheStore first, second;
  first.caches(running_origin()).attention.insert(attention_key(AttentionDirection::forward, 1), stored_plan(8));
  first.caches(running_origin()).attention.insert(attention_key(AttentionDirection::forward, 2), stored_plan(8));
  save(first, path);
  second.caches(running_origin()).attention.insert(attention_key(AttentionDirection::forward, 2), stored_plan(9));
  save(second, path);
  CacheStore loaded;
  load(loaded, path, kRunning);
  const AttentionPlanStore& plans = loaded.caches(running_origin()).attention;
  CHECK(plans.size() == 2);
  REQUIRE(plans.find(attention_key(AttentionDirection::forward, 2)) != nullptr);
  CHECK(plans.find(attention_key(AttentionDirection::forward, 2))->bytes.size() == 9);
}

TEST_CASE("a version-5 file, which has no attention plans, still loads, and cannot be written with them",
          "[checkpoint][attention]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  Checkpoint checkpoint = snapshot(store);
  checkpoint.header.format_version = 5;
  const Checkpoint read = deserialize(serialize(checkpoint), "v5.bin");
  CHECK(read.header.format_version == 5);
  CHECK(difference(checkpoint, read) == "");

  store.caches(running_origin()).attention.insert(attention_key(AttentionDirection::forward), stored_plan(4));
  checkpoint = snapshot(store);
  checkpoint.header.format_version = 5;
  CHECK_THAT(error_of([&] { serialize(checkpoint); }), Contains("file format 5 cannot hold attention plans"));
}

TEST_CASE("a file with a valid checksum but an invalid attention plan is rejected", "[checkpoint][attention]") {
  CacheStore store;
  add_handcrafted_entries(store, running_origin());
  Checkpoint checkpoint = snapshot(store);
  auto& plans = checkpoint.sections[0].attention;
  std::string reason;
  SECTION("an invalid key") {
    AttentionKey key = attention_key(AttentionDirection::forward);
    key.data_type = CUDNN_DATA_DOUBLE;
    plans = {{key, std::make_shared<const StoredPlan>(stored_plan(4))}};
    reason = "attention plan 0: attention data type";
  }
  SECTION("plans out of order") {
    plans = {{attention_key(AttentionDirection::forward, 2), std::make_shared<const StoredPlan>(stored_plan(4))},
             {attention_key(AttentionDirection::forward, 2), std::make_shared<const StoredPlan>(stored_plan(4))}};
    reason = "out of order or repeated";
  }
  SECTION("an empty plan") {
    plans = {{attention_key(AttentionDirection::forward), std::make_shared<const StoredPlan>(stored_plan(0))}};
    reason = "stored plan of 0 bytes";
  }
  CAPTURE(reason);
  CHECK_THAT(error_of([&] { deserialize(serialize(checkpoint), "forged.bin"); }),
             Contains("'forged.bin' is corrupt") && Contains(reason));
}

// --- Shared files: merging saves under the lock (Note [Shared cache files]) -------------------------------------

TEST_CASE("a save merges with what the file holds, faster measurement winning, and keeps the store as it was",
          "[checkpoint][shared]") {
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  const Origin origin = running_origin();
  const ConvolutionKey shared = conv_key(Direction::forward, 1);
  const ConvolutionKey only_on_disk = conv_key(Direction::forward, 2);
  const ConvolutionKey only_in_store = conv_key(Direction::forward, 3);
  CacheStore on_disk;
  on_disk.caches(origin).forward.insert(shared, Ranking<Fwd>::of({candidate<Fwd>(1, 1.0f), candidate<Fwd>(2, 3.0f)}));
  on_disk.caches(origin).forward.insert(only_on_disk, Ranking<Fwd>::of({candidate<Fwd>(1, 2.0f)}));
  add_synthetic_entries(on_disk, other_cudnn_origin(), 7);
  save(on_disk, path);

  CacheStore store;
  store.caches(origin).forward.insert(shared, Ranking<Fwd>::of({candidate<Fwd>(2, 0.5f)}));
  store.caches(origin).forward.insert(only_in_store, Ranking<Fwd>::of({candidate<Fwd>(4, 2.0f)}));
  const Checkpoint store_before = snapshot(store);
  const SaveReport report = save(store, path);

  CHECK(report.file_entries == 2 + 7);
  CHECK(report.entries == 3 + 7);
  CHECK(report.locked);
  CHECK(difference(store_before, snapshot(store)) == "");  // saving never changes the store
  CacheStore loaded;
  load(loaded, path, kRunning);
  CHECK(entries_of(loaded, other_cudnn_origin()) == 7);  // another process's origin is kept
  const auto merged = loaded.caches(origin).forward.find(shared);
  REQUIRE(merged);
  CHECK(merged->front().algorithm == static_cast<Fwd::Algorithm>(2));  // 0.5 ms beats 1.0 ms
  CHECK(merged->front().time_ms == 0.5f);
  CHECK(loaded.caches(origin).forward.find(only_on_disk));
  CHECK(loaded.caches(origin).forward.find(only_in_store));
}

TEST_CASE("a merging save writes a settled key's ranking in place of the file's and merges the others",
          "[checkpoint][shared]") {
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  const Origin origin = running_origin();
  const ConvolutionKey settled_key = conv_key(Direction::forward, 1);
  const ConvolutionKey merged_key = conv_key(Direction::forward, 2);
  // The file: what an earlier search found, config 1 first at 1.0 ms (timed under its tuning's load).
  CacheStore on_disk;
  on_disk.caches(origin).forward.insert(settled_key,
                                        Ranking<Fwd>::of({candidate<Fwd>(1, 1.0f), candidate<Fwd>(2, 3.0f)}));
  on_disk.caches(origin).forward.insert(merged_key, Ranking<Fwd>::of({candidate<Fwd>(1, 1.0f)}));
  save(on_disk, path);

  // This process loaded the file and settled the first key: config 2 ahead of config 1, on the settle's clock
  // (1.2 against 1.3 ms), which a merge with the file's 1.0 ms for config 1 would undo.
  CacheStore store;
  load(store, path, kRunning);
  const auto settled = Ranking<Fwd>::of({candidate<Fwd>(2, 1.2f), candidate<Fwd>(1, 1.3f)});
  store.caches(origin).forward.replace(settled_key, settled);
  store.caches(origin).forward.insert(merged_key, Ranking<Fwd>::of({candidate<Fwd>(3, 2.0f)}));
  save(store, path);

  CacheStore loaded;
  load(loaded, path, kRunning);
  const auto kept = loaded.caches(origin).forward.find(settled_key);
  REQUIRE(kept);
  INFO(testing::to_text(*kept));
  CHECK(*kept == settled);
  const auto merged = loaded.caches(origin).forward.find(merged_key);
  REQUIRE(merged);
  CHECK(*merged == Ranking<Fwd>::of({candidate<Fwd>(1, 1.0f), candidate<Fwd>(3, 2.0f)}));
  CHECK(loaded.caches(origin).forward.replaced_entries().empty());  // a load merges: nothing it read is marked

  SECTION("a key merged after its settle merges with the file again") {
    SaveOptions replace;
    replace.merge = false;
    save(on_disk, path, replace);  // the file as it was, config 1 at 1.0 ms
    store.caches(origin).forward.insert(settled_key, Ranking<Fwd>::of({candidate<Fwd>(4, 5.0f)}));
    save(store, path);
    CacheStore again;
    load(again, path, kRunning);
    CHECK(again.caches(origin).forward.find(settled_key)->front().time_ms == 1.0f);  // the file's config 1
  }
}

TEST_CASE("a merging save never overwrites a file it cannot read", "[checkpoint][shared]") {
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  write_plain(path, "not a cache file at all");
  CacheStore store;
  fill(store, 5);
  CHECK_THAT(error_of([&] { save(store, path); }),
             Contains(path) && Contains("wrong magic") && Contains("Nothing was written") && Contains("merge=False"));
  std::ifstream in(path, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "not a cache file at all");
  SaveOptions replace;
  replace.merge = false;
  CHECK(save(store, path, replace).entries == store.size());  // replacing is what the message offers
}

TEST_CASE("16 processes saving into one file at once lose no entry", "[checkpoint][shared]") {
  // Each process saves kRounds times, adding entries of its own origin each time; all start together. Without
  // the lock, read-merge-write cycles interleave and the last rename drops what others wrote in between.
  constexpr int kProcesses = 16, kRounds = 4;
  constexpr std::size_t kPerRound = 25;
  TemporaryFolder folder;
  const std::string path = folder.file("shared.bin");
  int start[2];
  REQUIRE(::pipe(start) == 0);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // no Catch2 in here
      ::close(start[1]);
      char go;
      if (::read(start[0], &go, 1) != 0) ::_exit(3);  // EOF: the parent let everyone go at once
      int code = 0;
      try {
        CacheStore store;
        const Origin origin =
            Origin::of(DeviceIdentity{"GPU of process " + std::to_string(p), 9, 0, 132}, kRunning);
        for (int round = 0; round < kRounds; ++round) {
          add_synthetic_entries(store, origin, kPerRound, 1000 * p + round);
          save(store, path);
        }
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(child);
  }
  ::close(start[0]);
  const auto started = std::chrono::steady_clock::now();
  ::close(start[1]);  // go
  for (pid_t child : children) {
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  WARN(kProcesses << " processes x " << kRounds << " saves: " << seconds << " s");
  const Checkpoint saved = read_checkpoint(path);
  CHECK(saved.sections.size() == kProcesses);
  CHECK(saved.size() == kProcesses * kRounds * kPerRound);
  for (const CheckpointSection& section : saved.sections) CHECK(section.size() == kRounds * kPerRound);
}

// --- Concurrency (scripts/sanitize.sh tsan runs the [concurrency] tests) -------------------------------------

TEST_CASE("threads insert into and find in every cache of new origins while others save, load and merge",
          "[checkpoint][concurrency]") {
  constexpr int kWriters = 4, kKeysPerWriter = 40;
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  CacheStore store;
  // Writer w fills origin w % 2 (created by whichever thread comes first) with keys nobody else writes, in
  // every direction of both backends, plus stored plans, and looks up keys of every writer as it goes.
  auto origin_of = [](int writer) {
    return Origin::of(DeviceIdentity{writer % 2 ? "GPU B" : "GPU A", 9, 0, 132}, kRunning);
  };
  auto key_of = [](Direction direction, int writer, int i) {
    return conv_key(direction, 1 + i, 1 + writer);  // channels tell writers apart, batches keys
  };
  std::atomic<int> writers_done{0}, bad_finds{0}, saves{0}, bad_saves{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kKeysPerWriter; ++i) {
        DirectionCaches& caches = store.caches(origin_of(w));
        caches.forward.insert(key_of(Direction::forward, w, i), Ranking<Fwd>::of({candidate<Fwd>(i % 8, 1.0f + i)}));
        caches.backward_data.insert(key_of(Direction::backward_data, w, i),
                                    Ranking<BwdData>::of({candidate<BwdData>(i % 6, 2.0f)}));
        caches.backward_filter.insert(key_of(Direction::backward_filter, w, i),
                                      Ranking<BwdFilter>::of({candidate<BwdFilter>(i % 7, 3.0f)}));
        caches.graph_forward.insert(key_of(Direction::forward, w, i),
                                    Ranking<GraphForwardTraits>::of({engine(i, 0.5f, {{2, i}})}));
        caches.graph_backward_data.insert(key_of(Direction::backward_data, w, i),
                                          Ranking<GraphBackwardDataTraits>::of({engine(i, 0.5f)}));
        caches.graph_backward_filter.insert(key_of(Direction::backward_filter, w, i),
                                            Ranking<GraphBackwardFilterTraits>::of({engine(i, 0.5f)}));
        StoredPlan plan;
        plan.config = engine(i, 0.5f);
        plan.bytes.assign(16 + i, static_cast<std::uint8_t>(w));
        caches.plans.insert(key_of(Direction::forward, w, i), plan);
        const int other = (w + 1 + i) % kWriters;
        const auto found = store.caches(origin_of(other)).forward.find(key_of(Direction::forward, other, i));
        if (found && found->front().time_ms != 1.0f + i) ++bad_finds;
        const auto mine = caches.graph_forward.find(key_of(Direction::forward, w, i));
        if (!mine || mine->front().engine_id != i) ++bad_finds;
      }
      ++writers_done;
    });
  }
  // Saves the store while it changes; each file must load and never hold fewer entries than the one before.
  threads.emplace_back([&] {
    std::size_t previous = 0;
    do {
      save(store, path);
      const Checkpoint read = read_checkpoint(path);
      if (read.size() < previous) ++bad_saves;  // the store only grows
      previous = read.size();
      ++saves;
    } while (writers_done.load() < kWriters);
  });
  // Loads those files into a second store while a reader walks it.
  CacheStore copy;
  std::atomic<bool> copying{true};
  threads.emplace_back([&] {
    while (writers_done.load() < kWriters) {
      try {
        load(copy, path, kRunning);
      } catch (const Error&) {  // no file saved yet
      }
    }
    copying = false;
  });
  threads.emplace_back([&] {
    while (copying.load()) {
      for (const auto& [origin, caches] : copy.origins()) {
        for (const auto& [key, ranking] : caches->graph_forward.entries()) {
          if (ranking.empty() || ranking.front().engine_id != key.input.dims[0] - 1) ++bad_finds;
        }
      }
      (void)snapshot(copy);
    }
  });
  for (auto& thread : threads) thread.join();
  CHECK(bad_finds == 0);
  CHECK(bad_saves == 0);
  CHECK(saves > 0);

  save(store, path);
  const Checkpoint final_file = read_checkpoint(path);
  CHECK(difference(snapshot(store), final_file) == "");
  CHECK(final_file.size() == static_cast<std::size_t>(kWriters * kKeysPerWriter * 6));
  load(copy, path, kRunning);
  CHECK(difference(snapshot(store), snapshot(copy)) == "");
}

// --- Crash safety: Note [Atomic save] under SIGKILL -------------------------------------------------------------

namespace {

// Runs `tool validate path`; true if it exits 0. Without the tool (CUDNN_CACHE_TOOL undefined), true.
bool tool_validates(const std::string& path) {
#ifdef CUDNN_CACHE_TOOL
  const pid_t child = ::fork();
  if (child == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::execl(CUDNN_CACHE_TOOL, CUDNN_CACHE_TOOL, "validate", path.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
#else
  (void)path;
  return true;
#endif
}

}  // namespace

// A child saves two stores over one file in turn, forever; the parent kills it with SIGKILL after a random
// delay spread over a little more than one save of each, many times. After every kill the file must be one of
// the two complete files, byte for byte, and validate; a temporary file may be left behind (Note [Atomic
// save]), nothing else. Half the kills hit save() itself, whose time goes mostly to snapshot and serialize;
// the other half hit write_file_atomically with the bytes ready, so that they land in the file operations.
TEST_CASE("a save killed with SIGKILL at any moment leaves the old or the new file, complete", "[checkpoint][crash]") {
  constexpr int kKills = 250;
  TemporaryFolder folder;
  const std::string path = folder.file("cache.bin");
  CacheStore first, second;
  fill(first, 3000, 1);
  fill(second, 2000, 2);
  const std::string first_bytes = serialize(snapshot(first));
  const std::string second_bytes = serialize(snapshot(second));
  REQUIRE(first_bytes != second_bytes);
  save(first, path);

  std::mt19937 random(4242);
  int found_first = 0, found_second = 0, temporaries_left = 0;
  // Replacing saves, so that each complete file is exactly one store's bytes; a merging save goes through the
  // same write_file_atomically, under the lock (its file "cache.bin.lock" stays, and is empty).
  SaveOptions replace;
  replace.merge = false;
  for (const bool whole_save : {true, false}) {
    const auto save_both = [&] {
      if (whole_save) {
        save(second, path, replace);
        save(first, path, replace);
      } else {
        write_file_atomically(path, second_bytes);
        write_file_atomically(path, first_bytes);
      }
    };
    const auto started = std::chrono::steady_clock::now();
    save_both();
    const auto cycle = std::chrono::steady_clock::now() - started;
    const long cycle_us = static_cast<long>(std::chrono::duration_cast<std::chrono::microseconds>(cycle).count());
    std::uniform_int_distribution<long> delay_us(0, cycle_us * 5 / 4 + 1);
    for (int kill = 0; kill < kKills / 2; ++kill) {
      const pid_t child = ::fork();
      REQUIRE(child >= 0);
      if (child == 0) {  // no Catch2 in here
        try {
          for (;;) save_both();
        } catch (...) {
        }
        ::_exit(1);
      }
      const long delay = delay_us(random);
      ::usleep(static_cast<useconds_t>(delay));
      REQUIRE(::kill(child, SIGKILL) == 0);
      int status = 0;
      REQUIRE(::waitpid(child, &status, 0) == child);
      CAPTURE(whole_save, kill, delay);
      REQUIRE(WIFSIGNALED(status));  // it was still saving, not failed

      const std::string bytes = read_file(path);
      const bool is_first = bytes == first_bytes, is_second = bytes == second_bytes;
      CHECK((is_first || is_second));
      found_first += is_first;
      found_second += is_second;
      CHECK_NOTHROW(read_checkpoint(path));
      CHECK(tool_validates(path));
      for (const std::string& name : folder.listing()) {  // the file, its lock, and maybe one temporary of it
        if (name == "cache.bin" || name == "cache.bin.lock") continue;
        CHECK(name.rfind(".cache.bin.tmp.", 0) == 0);
        ++temporaries_left;
        std::filesystem::remove(folder.file(name));
      }
    }
  }
  INFO("after " << kKills << " kills: the first file " << found_first << " times, the second " << found_second
                << ", a temporary file left " << temporaries_left << " times");
  CHECK(found_first + found_second == kKills);
  // The kills fell both between saves and inside them: each file was found, and temporaries were left. (How
  // often depends on the machine's speed, so only their presence is required.)
  CHECK(found_first > 0);
  CHECK(found_second > 0);
  CHECK(temporaries_left > 0);
  WARN("crash-safety: " << kKills << " kills; the first file " << found_first << " times, the second "
                        << found_second << ", a temporary file left " << temporaries_left << " times");
}
