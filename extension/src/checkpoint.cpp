#include "cudnn_cache/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/serialization.h"

// The layout of a cache file. Every field is little-endian, written through one cereal
// PortableBinaryOutputArchive; the payload is a second archive's bytes, embedded as a blob.
//
//   offset  size  field
//   +-----+-----+---------------------------------------------------------------+
//   |   0 |   1 | cereal endianness flag: 1 (little-endian)                     |
//   |   1 |   8 | magic "CDNNCACH"                                              |  header
//   |   9 |   4 | format version (kFormatVersion)                               |
//   |  13 |   4 | cuDNN version of the writer (e.g. 91900)                      |
//   |  17 |   4 | CUDA runtime version of the writer (e.g. 13000)               |
//   |  21 |   8 | payload size P in bytes                                       |
//   +-----+-----+---------------------------------------------------------------+
//   |  29 |   P | payload archive:                                              |
//   |     |     |   u8  endianness flag                                         |
//   |     |     |   u64 number of sections, then per section:                   |
//   |     |     |     Origin  {DeviceIdentity {name, cc major, cc minor, SMs},  |
//   |     |     |              cuDNN major, cuDNN minor}                        |
//   |     |     |     3 x (u64 count, count x {ConvolutionKey, Ranking})        |
//   |     |     |         key: its 47 i32 words; ranking: u64 n, n candidates   |
//   |     |     |         (v4+: an engine config ends with i32 heuristic_index) |
//   |     |     |         legacy forward, backward_data, backward_filter        |
//   |     |     |     3 x the same for the graph API's engine configs      (v2+)|
//   |     |     |     u64 count, count x {ConvolutionKey, StoredPlan}      (v3+)|
//   |     |     |         plan: engine config, u32 cuDNN version,               |
//   |     |     |               u64 n, n bytes of cudnn-frontend's plan         |
//   |     |     |     2 x (u64 count, count x ConvolutionKey)              (v4+)|
//   |     |     |         pending keys of the graph API, of the legacy API      |
//   |     |     |     u64 count, count x {AttentionKey, StoredPlan}        (v6+)|
//   |     |     |         key: its 77 i64 words                                 |
//   |     |     |   (each class's u32 cereal version precedes its first use)    |
//   +-----+-----+---------------------------------------------------------------+
//   | 29+P|   8 | checksum of bytes [0, 29 + P)                                 |
//   +-----+-----+---------------------------------------------------------------+
//
// Note [Checksum]
// ~~~~~~~~~~~~~~~
// The checksum is a 64-bit multiply/xor-shift hash taken 8 bytes at a time. Each step is a bijection of the
// running state for a fixed input word, so two inputs that differ within a single 8-byte word always end in
// different states: every flipped bit, and every corrupted byte, is detected, not just most of them. Wider
// damage is caught with probability 1 - 2^-64. It is not a defence against deliberate forgery; the loader's
// own checks (serialization.h) are what keep a forged file from doing harm.

namespace cudnn_cache {
namespace {

// An istream over bytes in its get area, refilled by underflow() where a subclass has more. cereal reads every
// value through xsgetn, so that is a bounded memcpy here rather than std::streambuf's general loop.
class ByteStream : protected std::streambuf, public std::istream {
 protected:
  // std::istream has these names too.
  using int_type = std::streambuf::int_type;
  using traits_type = std::streambuf::traits_type;

  ByteStream() : std::istream(static_cast<std::streambuf*>(this)) {}

 private:
  std::streamsize xsgetn(char* destination, std::streamsize count) override {
    std::streamsize copied = 0;
    while (copied < count) {
      if (gptr() == egptr() && underflow() == traits_type::eof()) break;
      const std::streamsize now = std::min<std::streamsize>(count - copied, egptr() - gptr());
      std::memcpy(destination + copied, gptr(), static_cast<std::size_t>(now));
      setg(eback(), gptr() + now, egptr());
      copied += now;
    }
    return copied;
  }
};

// Reads bytes in place, so parsing a file's bytes does not copy them again.
class MemoryStream : public ByteStream {
 public:
  MemoryStream(const char* data, std::size_t size) {
    char* begin = const_cast<char*>(data);  // get area only: never written through
    setg(begin, begin, begin + size);
  }
};

// Reads bytes [begin, end) of a file through a buffer of its own, so parsing a large file neither holds it whole
// nor touches fresh memory for all of it. Stops early where the file does (a file cut while it is read): the
// parse then fails on the missing bytes.
class FileStream : public ByteStream {
 public:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 20;

  FileStream(const ReadableFile& file, std::size_t begin, std::size_t end)
      : file_(file), next_(begin), end_(end), buffer_(kBufferBytes) {}

 private:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const std::size_t wanted = std::min(buffer_.size(), end_ - next_);
    const std::size_t got = wanted == 0 ? 0 : file_.read_at(next_, buffer_.data(), wanted);
    next_ += got;
    if (got < wanted) end_ = next_;  // the file ended early
    setg(buffer_.data(), buffer_.data(), buffer_.data() + got);
    return got == 0 ? traits_type::eof() : traits_type::to_int_type(*gptr());
  }

  const ReadableFile& file_;
  std::size_t next_, end_;  // the file's next unread byte, and the end of the range
  std::vector<char> buffer_;
};

constexpr std::size_t kHeaderBytes = 1 + kMagic.size() + 4 + 4 + 4 + 8;
constexpr std::size_t kChecksumBytes = 8;

}  // namespace

namespace {

// Note [Checksum], taken in pieces: every piece but the last a whole number of words.
class Checksum {
 public:
  explicit Checksum(std::size_t size) : state_(0xcbf29ce484222325ull ^ size) {}

  void add_words(const char* data, std::size_t size) {
    for (std::size_t offset = 0; offset + 8 <= size; offset += 8) {
      std::uint64_t word;
      std::memcpy(&word, data + offset, 8);
      step(word);
    }
  }

  // The checksum, with the last piece.
  std::uint64_t finish(const char* data, std::size_t size) {
    const std::size_t words = size / 8 * 8;
    add_words(data, words);
    std::uint64_t tail = 0;
    std::memcpy(&tail, data + words, size - words);
    step(tail);
    return state_;
  }

 private:
  void step(std::uint64_t word) {
    state_ = (state_ ^ word) * 0x9e3779b97f4a7c15ull;
    state_ ^= state_ >> 29;
  }

  std::uint64_t state_;
};

}  // namespace

std::uint64_t checksum(const char* data, std::size_t size) { return Checksum(size).finish(data, size); }

namespace {

template <typename Traits>
void write_entries(cereal::PortableBinaryOutputArchive& archive, const CheckpointSection& section) {
  const auto& entries = section.entries<Traits>();
  archive(cereal::make_size_tag(static_cast<cereal::size_type>(entries.size())));
  for (const auto& [key, ranking] : entries) archive(key, ranking);
}

// Checks that `key` is valid and comes after `previous` (null for the first), as a file's keys of one list do;
// the error names the key as the words of `name` say ("forward entry 3", "stored plan 2", ...).
template <typename Key, typename... Name>
void check_next_key(const Key* previous, const Key& key, const Name&... name) {
  if (const std::string problem = check_key(key); !problem.empty()) detail::throw_invalid(name..., ": ", problem);
  if (previous && !(*previous < key)) detail::throw_invalid(name..., " is out of order or repeated");
}

// Appends entry i of a cache after checking it belongs there: its direction, a valid key, and key order.
template <typename Traits>
void append_entry(CheckpointSection& section, typename PerfCache<Traits>::Entry entry, std::size_t i) {
  auto& entries = section.entries<Traits>();
  const char* direction = to_string(Traits::direction);
  if (entry.first.direction != static_cast<std::int32_t>(Traits::direction)) {
    detail::throw_invalid(direction, " entry ", i, " has a key of another direction");
  }
  check_next_key(entries.empty() ? nullptr : &entries.back().first, entry.first, direction, " entry ", i);
  entries.push_back(std::move(entry));
}

// A section's stored plans of Key (convolutions' or attention's), and their name in messages and JSON.
std::vector<PlanStore::Entry>& plans_of(CheckpointSection& section, const ConvolutionKey*) { return section.plans; }
std::vector<AttentionPlanStore::Entry>& plans_of(CheckpointSection& section, const AttentionKey*) {
  return section.attention;
}
template <typename Key>
const auto& plans_of(const CheckpointSection& section, const Key* key) {
  return plans_of(const_cast<CheckpointSection&>(section), key);
}
// In messages ("stored plan 3") and as the JSON field.
const char* plans_name(const ConvolutionKey*, bool json = false) { return json ? "stored_plans" : "stored plan"; }
const char* plans_name(const AttentionKey*, bool json = false) { return json ? "attention_plans" : "attention plan"; }

// Appends stored plan i of Key after checking its key and key order.
template <typename Key>
void append_plan(CheckpointSection& section, const Key& key, StoredPlan plan, std::size_t i) {
  auto& plans = plans_of(section, &key);
  check_next_key(plans.empty() ? nullptr : &plans.back().first, key, plans_name(&key), " ", i);
  plans.emplace_back(key, std::make_shared<const StoredPlan>(std::move(plan)));
}

// The fewest bytes an entry takes in a file: its key, a ranking's count and one candidate of the smallest kind.
constexpr std::size_t kMinEntryBytes = sizeof(ConvolutionKey) + 8 + 28;

// Counts are not trusted: entries are appended as they parse, so a wrong count ends at the end of the bytes,
// and room is made for no more entries than a payload of `payload_bytes` could hold.
template <typename Traits>
void read_entries(cereal::PortableBinaryInputArchive& archive, CheckpointSection& section,
                  std::size_t payload_bytes) {
  cereal::size_type count = 0;
  archive(cereal::make_size_tag(count));
  section.entries<Traits>().reserve(std::min<std::size_t>(count, payload_bytes / kMinEntryBytes));
  for (cereal::size_type i = 0; i < count; ++i) {
    typename PerfCache<Traits>::Entry entry;
    archive(entry.first, entry.second);
    append_entry<Traits>(section, std::move(entry), i);
  }
}

// Version 1 files hold the legacy caches only; version 2 added the graph API's, version 3 stored plans, version 4
// pending keys.
bool holds_graph_entries(std::uint32_t format_version) { return format_version >= 2; }
bool holds_plans(std::uint32_t format_version) { return format_version >= 3; }
bool holds_pending(std::uint32_t format_version) { return format_version >= 4; }
bool holds_attention(std::uint32_t format_version) { return format_version >= 6; }

// The pending keys of one backend in a section, and their name in messages and JSON.
std::vector<ConvolutionKey>& pending_of(CheckpointSection& section, bool graph) {
  return graph ? section.pending_graph : section.pending_legacy;
}
const std::vector<ConvolutionKey>& pending_of(const CheckpointSection& section, bool graph) {
  return graph ? section.pending_graph : section.pending_legacy;
}
const char* pending_name(bool graph) { return graph ? "pending_graph" : "pending_legacy"; }

// Appends pending key i after checking it and key order.
void append_pending(CheckpointSection& section, bool graph, const ConvolutionKey& key, std::size_t i) {
  std::vector<ConvolutionKey>& keys = pending_of(section, graph);
  check_next_key(keys.empty() ? nullptr : &keys.back(), key, pending_name(graph), " key ", i);
  keys.push_back(key);
}

void write_pending(cereal::PortableBinaryOutputArchive& archive, const CheckpointSection& section) {
  for (const bool graph : {true, false}) {
    const std::vector<ConvolutionKey>& keys = pending_of(section, graph);
    archive(cereal::make_size_tag(static_cast<cereal::size_type>(keys.size())));
    for (const ConvolutionKey& key : keys) archive(key);
  }
}

void read_pending(cereal::PortableBinaryInputArchive& archive, CheckpointSection& section, std::size_t payload_bytes) {
  for (const bool graph : {true, false}) {
    cereal::size_type count = 0;
    archive(cereal::make_size_tag(count));
    pending_of(section, graph).reserve(std::min<std::size_t>(count, payload_bytes / sizeof(ConvolutionKey)));
    for (cereal::size_type i = 0; i < count; ++i) {
      ConvolutionKey key;
      archive(key);
      append_pending(section, graph, key, i);
    }
  }
}

template <typename Key>
void write_plans(cereal::PortableBinaryOutputArchive& archive, const CheckpointSection& section) {
  const auto& plans = plans_of(section, static_cast<const Key*>(nullptr));
  archive(cereal::make_size_tag(static_cast<cereal::size_type>(plans.size())));
  for (const auto& [key, plan] : plans) archive(key, *plan);
}

template <typename Key>
void read_plans(cereal::PortableBinaryInputArchive& archive, CheckpointSection& section) {
  cereal::size_type count = 0;
  archive(cereal::make_size_tag(count));
  for (cereal::size_type i = 0; i < count; ++i) {
    Key key;
    StoredPlan plan;
    archive(key, plan);
    append_plan(section, key, std::move(plan), i);
  }
}

// The name of a cache in JSON: "legacy_forward", "graph_backward_filter", ...
template <typename Traits>
std::string json_name() {
  return std::string(is_graph<Traits> ? "graph_" : "legacy_") +
         to_string(Traits::direction);
}

// Calls f() inside a JSON array named `name`, one element each time `element` runs.
template <typename Archive, typename F>
void json_array(Archive& archive, const std::string& name, F&& f) {
  archive.setNextName(name.c_str());
  archive.startNode();
  if constexpr (std::is_same_v<Archive, cereal::JSONOutputArchive>) archive.makeArray();
  f();
  archive.finishNode();
}

std::string serialize_payload(const Checkpoint& checkpoint) {
  const std::uint32_t version = checkpoint.header.format_version;
  const bool graph = holds_graph_entries(version);
  std::ostringstream bytes(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive archive(bytes);
    archive(cereal::make_size_tag(static_cast<cereal::size_type>(checkpoint.sections.size())));
    for (const CheckpointSection& section : checkpoint.sections) {
      archive(section.origin);
      for_each_direction([&](auto traits) { write_entries<decltype(traits)>(archive, section); });
      for_each_graph_direction([&](auto traits) {
        using Traits = decltype(traits);
        if (graph) {
          write_entries<Traits>(archive, section);
        } else {
          CUDNN_CACHE_REQUIRE(section.entries<Traits>().empty(), "file format ", version,
                              " cannot hold graph-API entries; write format ", kFormatVersion);
        }
      });
      if (holds_plans(version)) {
        write_plans<ConvolutionKey>(archive, section);
      } else {
        CUDNN_CACHE_REQUIRE(section.plans.empty(), "file format ", version, " cannot hold stored plans; write format ",
                            kFormatVersion);
      }
      if (holds_pending(version)) {
        write_pending(archive, section);
      } else {
        CUDNN_CACHE_REQUIRE(section.pending() == 0, "file format ", version, " cannot hold pending keys; write format ",
                            kFormatVersion);
      }
      if (holds_attention(version)) {
        write_plans<AttentionKey>(archive, section);
      } else {
        CUDNN_CACHE_REQUIRE(section.attention.empty(), "file format ", version,
                            " cannot hold attention plans; write format ", kFormatVersion);
      }
    }
  }
  return std::move(bytes).str();
}

// The sections of a payload of `size` bytes; `bytes` ends where the payload does.
std::vector<CheckpointSection> deserialize_payload(std::istream& bytes, std::size_t size,
                                                   std::uint32_t format_version) {
  cereal::PortableBinaryInputArchive archive(bytes);
  cereal::size_type count = 0;
  archive(cereal::make_size_tag(count));
  std::vector<CheckpointSection> sections;
  for (cereal::size_type i = 0; i < count; ++i) {
    CheckpointSection section;
    archive(section.origin);
    if (!sections.empty() && !(sections.back().origin < section.origin)) {
      detail::throw_invalid("section ", i, " is out of order or repeated");
    }
    const auto read = [&](auto traits) {
      read_entries<decltype(traits)>(archive, section, size);
    };
    for_each_direction(read);
    if (holds_graph_entries(format_version)) for_each_graph_direction(read);
    if (holds_plans(format_version)) read_plans<ConvolutionKey>(archive, section);
    if (holds_pending(format_version)) read_pending(archive, section, size);
    if (holds_attention(format_version)) read_plans<AttentionKey>(archive, section);
    sections.push_back(std::move(section));
  }
  if (bytes.peek() != std::char_traits<char>::eof()) detail::throw_invalid("bytes after the last section");
  return sections;
}

template <typename... Args>
[[noreturn]] void throw_file_error(const std::string& source, const Args&... reason) {
  throw Error(detail::concat("'", source, "' ", reason...));
}

}  // namespace

std::size_t Checkpoint::size() const {
  std::size_t total = 0;
  for (const auto& section : sections) total += section.size();
  return total;
}

std::size_t Checkpoint::pending() const {
  std::size_t total = 0;
  for (const auto& section : sections) total += section.pending();
  return total;
}

Checkpoint snapshot(const CacheStore& store) {
  Checkpoint checkpoint;
  checkpoint.header.format_version = kFormatVersion;
  checkpoint.header.cudnn_version = CudnnVersion::of_library().number();
  checkpoint.header.cuda_runtime_version = cuda_runtime_version();
  for (const auto& [origin, caches] : store.origins()) {
    CheckpointSection section;
    section.origin = origin;
    for_each_cache([&, caches = caches](auto traits) {
      using Traits = decltype(traits);
      section.entries<Traits>() = caches->template get<Traits>().entries();
    });
    section.plans = caches->plans.entries();
    section.pending_graph = caches->pending_keys(true);
    section.pending_legacy = caches->pending_keys(false);
    section.attention = caches->attention.entries();
    if (section.size() > 0 || !section.plans.empty() || section.pending() > 0 || !section.attention.empty()) {
      checkpoint.sections.push_back(std::move(section));
    }
  }
  return checkpoint;
}

void merge_into(CacheStore& store, Checkpoint checkpoint) {
  for (CheckpointSection& section : checkpoint.sections) {
    DirectionCaches& caches = store.caches(section.origin);
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      PerfCache<Traits>& cache = caches.get<Traits>();
      cache.reserve(section.entries<Traits>().size());
      for (auto& [key, ranking] : section.entries<Traits>()) cache.insert(key, std::move(ranking));
    });
    for (const auto& [key, plan] : section.plans) caches.plans.insert(key, *plan);
    for (const auto& [key, plan] : section.attention) caches.attention.insert(key, *plan);
    for (const bool graph : {true, false}) {
      for (const ConvolutionKey& key : pending_of(section, graph)) caches.pending.insert(graph, key);
    }
  }
}

namespace {

// The rankings the store's caches hold by replace(), put back in `merged` in place of their merge with a file's
// (Note [A settled key replaces the file's] in perf_cache.h).
void keep_replaced(CacheStore& merged, const CacheStore& store) {
  for_each_replaced(store, [&](const Origin& origin, auto traits, const ConvolutionKey& key, auto ranking) {
    merged.caches(origin).template get<decltype(traits)>().replace(key, std::move(ranking));
  });
}

}  // namespace

std::string serialize(const Checkpoint& checkpoint) {
  return frame_payload(checkpoint.header, serialize_payload(checkpoint));
}

std::string frame_payload(const CheckpointHeader& header, const std::string& payload) {
  std::ostringstream bytes(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive archive(bytes);
    archive(cereal::binary_data(kMagic.data(), kMagic.size()), header.format_version, header.cudnn_version,
            header.cuda_runtime_version, static_cast<std::uint64_t>(payload.size()));
    archive(cereal::binary_data(payload.data(), payload.size()));
    const std::string framed = bytes.str();
    archive(checksum(framed.data(), framed.size()));
  }
  return std::move(bytes).str();
}

namespace {

// What a file's header says, checked against the file's size.
struct Frame {
  CheckpointHeader header;
  std::uint64_t payload_size = 0;

  std::size_t checked() const { return kHeaderBytes + payload_size; }  // the bytes the checksum covers
};

// The frame of a file of `total` bytes whose first min(total, kHeaderBytes) bytes are `head`. Throws Error
// naming `source`: not a cache file, truncated, written by a newer cudnn_cache, or bytes after the checksum.
Frame read_frame(const char* head, std::size_t total, const std::string& source) {
  const std::string start = std::string(1, '\1') + std::string(kMagic.begin(), kMagic.end());
  const std::size_t seen = std::min(total, start.size());
  if (start.compare(0, seen, head, seen) != 0) {
    throw_file_error(source, "is not a cudnn_cache file (wrong magic); check the path");
  }
  if (total < kHeaderBytes) {
    throw_file_error(source, "is truncated: ", total, " bytes, shorter than the ", kHeaderBytes,
                     "-byte header; restore it from a backup or run the warm start again");
  }
  Frame frame;
  {
    MemoryStream header(head, kHeaderBytes);
    cereal::PortableBinaryInputArchive archive(header);
    std::array<char, kMagic.size()> magic{};
    archive(cereal::binary_data(magic.data(), magic.size()), frame.header.format_version,
            frame.header.cudnn_version, frame.header.cuda_runtime_version, frame.payload_size);
  }
  const std::uint32_t version = frame.header.format_version;
  if (version > kFormatVersion) {
    throw_file_error(source, "was written by a newer cudnn_cache (file format ", version, "; this build reads 1 to ",
                     kFormatVersion, "); upgrade cudnn_cache to use it");
  }
  if (version == 0) throw_file_error(source, "is corrupt: file format version 0 does not exist");
  const std::uint64_t after_header = total - kHeaderBytes;
  if (frame.payload_size > after_header || after_header - frame.payload_size < kChecksumBytes) {
    throw_file_error(source, "is truncated: it has ", total, " bytes but its header promises a ", frame.payload_size,
                     "-byte payload and a checksum after the ", kHeaderBytes,
                     "-byte header; restore it from a backup or run the warm start again");
  }
  if (after_header - frame.payload_size > kChecksumBytes) {
    throw_file_error(source, "is corrupt: ", after_header - frame.payload_size - kChecksumBytes,
                     " unexpected bytes after the checksum; delete it and run the warm start again");
  }
  return frame;
}

// Compares the checksum the file stores (its 8 bytes, little-endian as the portable archive wrote them) with
// the one its bytes give.
void check_checksum(const char* stored_bytes, std::uint64_t computed, const std::string& source) {
  std::uint64_t stored = 0;
  for (std::size_t i = 0; i < kChecksumBytes; ++i) {
    stored |= static_cast<std::uint64_t>(static_cast<unsigned char>(stored_bytes[i])) << (8 * i);
  }
  if (stored != computed) {
    throw_file_error(source, "is corrupt: checksum mismatch; delete it and run the warm start again");
  }
}

// The checkpoint of a checked frame whose payload `bytes` reads.
Checkpoint parse(const Frame& frame, std::istream& bytes, const std::string& source) {
  Checkpoint checkpoint;
  checkpoint.header = frame.header;
  try {
    checkpoint.sections = deserialize_payload(bytes, frame.payload_size, frame.header.format_version);
  } catch (const cereal::Exception& e) {
    throw_file_error(source, "is corrupt: ", e.what(), "; delete it and run the warm start again");
  }
  return checkpoint;
}

}  // namespace

Checkpoint deserialize(const std::string& bytes, const std::string& source) {
  const Frame frame = read_frame(bytes.data(), bytes.size(), source);
  check_checksum(bytes.data() + frame.checked(), checksum(bytes.data(), frame.checked()), source);
  MemoryStream payload(bytes.data() + kHeaderBytes, frame.payload_size);
  return parse(frame, payload, source);
}

// The file is read twice through a buffer, to check its checksum and then to parse it, instead of once into
// memory of its size: a file of 100,000 entries is 37 MB, and touching that much fresh memory took a quarter of
// its load. Both reads come from the page cache.
Checkpoint read_checkpoint(const std::string& path) {
  const ReadableFile file(path);
  std::array<char, kHeaderBytes> head{};
  const std::size_t got = file.read_at(0, head.data(), head.size());
  const Frame frame = read_frame(head.data(), got < head.size() ? got : file.size(), path);
  std::vector<char> buffer(FileStream::kBufferBytes);
  Checksum sum(frame.checked());
  std::size_t offset = 0;
  for (;;) {
    const std::size_t wanted = std::min(buffer.size(), frame.checked() - offset);
    if (file.read_at(offset, buffer.data(), wanted) < wanted) {
      throw_file_error(path, "was cut short while it was read; load it again once its writer is done");
    }
    offset += wanted;
    if (offset == frame.checked()) {
      const std::uint64_t computed = sum.finish(buffer.data(), wanted);
      std::array<char, kChecksumBytes> stored{};
      if (file.read_at(offset, stored.data(), stored.size()) < stored.size()) {
        throw_file_error(path, "was cut short while it was read; load it again once its writer is done");
      }
      check_checksum(stored.data(), computed, path);
      break;
    }
    sum.add_words(buffer.data(), wanted);  // a whole number of words: the buffer's size is
  }
  FileStream payload(file, kHeaderBytes, frame.checked());
  return parse(frame, payload, path);
}

std::string to_json(const Checkpoint& checkpoint) {
  std::ostringstream text;
  {
    cereal::JSONOutputArchive archive(text);
    archive(cereal::make_nvp("format_version", checkpoint.header.format_version),
            cereal::make_nvp("cudnn_version", checkpoint.header.cudnn_version),
            cereal::make_nvp("cuda_runtime_version", checkpoint.header.cuda_runtime_version));
    json_array(archive, "sections", [&] {
      for (const CheckpointSection& section : checkpoint.sections) {
        archive.startNode();
        archive(cereal::make_nvp("origin", section.origin));
        for_each_cache([&](auto traits) {
          using Traits = decltype(traits);
          json_array(archive, json_name<Traits>(), [&] {
            for (const auto& [key, ranking] : section.entries<Traits>()) {
              archive.startNode();
              archive(cereal::make_nvp("key", key), cereal::make_nvp("ranking", ranking));
              archive.finishNode();
            }
          });
        });
        const auto write_json_plans = [&](const auto& plans) {
          using Key = typename std::decay_t<decltype(plans)>::value_type::first_type;
          json_array(archive, plans_name(static_cast<const Key*>(nullptr), true), [&] {
            for (const auto& [key, plan] : plans) {
              archive.startNode();
              archive(cereal::make_nvp("key", key), cereal::make_nvp("plan", *plan));
              archive.finishNode();
            }
          });
        };
        write_json_plans(section.plans);
        if (holds_pending(checkpoint.header.format_version)) {
          for (const bool graph : {true, false}) {
            json_array(archive, pending_name(graph), [&] {
              for (const ConvolutionKey& key : pending_of(section, graph)) archive(key);
            });
          }
        }
        if (holds_attention(checkpoint.header.format_version)) write_json_plans(section.attention);
        archive.finishNode();
      }
    });
  }
  return std::move(text).str() + '\n';
}

namespace {

// Note [Reading a JSON export]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cereal's JSON reader reports a missing field as "provided NVP (name) not found", a value of the wrong type as
// one of RapidJSON's internal assertions ("IsObject()", "data_.f.flags & kUintFlag"), and skips fields it does
// not know. A person edits exports by hand, so from_json says instead where it was (the section and entry),
// which field, and what was expected; and it refuses a field it did not read, since a misspelt one would
// otherwise be dropped without a word. Which fields exist is not listed a second time here: an export of what
// was read has exactly the fields the reader knows, so the given document is compared with that.

// The words for a failure of cereal's reader at `field` (nullptr inside an array), or "" for the project's own
// messages, which say what was wrong already.
std::string json_problem(const cereal::Exception& error, const char* field) {
  const std::string what = error.what();
  const std::string subject = field ? std::string("field '") + field + "'" : std::string("a value");
  const std::string missing_prefix = "JSON Parsing failed - provided NVP (", missing_suffix = ") not found";
  if (what.rfind(missing_prefix, 0) == 0 && what.size() >= missing_prefix.size() + missing_suffix.size()) {
    return "missing field '" +
           what.substr(missing_prefix.size(), what.size() - missing_prefix.size() - missing_suffix.size()) + "'";
  }
  if (what == "No more objects in input") return "a value is missing: an object or array ends early";
  if (!dynamic_cast<const cereal::RapidJSONException*>(&error)) return "";
  const auto mentions = [&](const char* text) { return what.find(text) != std::string::npos; };
  // cereal enters arrays and objects alike, and asserts IsObject() when the value is neither.
  if (mentions("IsObject")) return subject + " must be an object or an array";
  if (mentions("IsArray")) return subject + " must be an array";
  if (mentions("IsString")) return subject + " must be a string";
  if (mentions("IsBool")) return subject + " must be true or false";
  return subject + " must be a number of its field's kind (an integer in range, or a float)";
}

// The path of the first member of `given` that `known` lacks, or of an array element beyond `known`'s end;
// "" when there is none. Follows only what both hold, so it goes no deeper than an export does.
std::string unknown_field(const rapidjson::Value& given, const rapidjson::Value& known, const std::string& path) {
  if (given.IsObject() && known.IsObject()) {
    for (auto member = given.MemberBegin(); member != given.MemberEnd(); ++member) {
      const std::string name(member->name.GetString(), member->name.GetStringLength());
      const std::string inner = path.empty() ? name : path + "." + name;
      const auto match = known.FindMember(member->name);
      if (match == known.MemberEnd()) return "unknown field '" + inner + "'";
      if (std::string found = unknown_field(member->value, match->value, inner); !found.empty()) return found;
    }
  } else if (given.IsArray() && known.IsArray()) {
    if (given.Size() > known.Size()) {
      return detail::concat(path, " has ", given.Size(), " values, ", known.Size(), " expected");
    }
    for (rapidjson::SizeType i = 0; i < given.Size(); ++i) {
      if (std::string found = unknown_field(given[i], known[i], detail::concat(path, "[", i, "]")); !found.empty()) {
        return found;
      }
    }
  }
  return "";
}

}  // namespace

Checkpoint from_json(const std::string& text, const std::string& source) {
  const auto invalid = [&](const auto&... reason) {
    throw_file_error(source, "is not a valid cudnn_cache JSON export: ", reason...);
  };
  rapidjson::Document document;  // parsed here first, for its syntax errors and for unknown_field
  document.Parse(text.data(), text.size());
  if (document.HasParseError()) {
    invalid("not JSON at byte ", document.GetErrorOffset(), " (", rapidjson::GetParseError_En(document.GetParseError()),
            ")");
  }
  if (!document.IsObject()) invalid("it must be one object, {\"format_version\": ..., \"sections\": [...]}");

  Checkpoint checkpoint;
  std::string where;  // the section or entry being read, for messages
  try {
    MemoryStream stream(text.data(), text.size());
    cereal::JSONInputArchive archive(stream);
    try {
      archive(cereal::make_nvp("format_version", checkpoint.header.format_version),
              cereal::make_nvp("cudnn_version", checkpoint.header.cudnn_version),
              cereal::make_nvp("cuda_runtime_version", checkpoint.header.cuda_runtime_version));
      const std::uint32_t version = checkpoint.header.format_version;
      if (version == 0 || version > kFormatVersion) {
        detail::throw_invalid("format_version ", version, " (this build reads 1 to ", kFormatVersion, ")");
      }
      json_array(archive, "sections", [&] {
        cereal::size_type sections = 0;
        archive.loadSize(sections);
        for (cereal::size_type i = 0; i < sections; ++i) {
          CheckpointSection section;
          where = detail::concat("sections[", i, "]");
          archive.startNode();
          archive(cereal::make_nvp("origin", section.origin));
          if (!checkpoint.sections.empty() && !(checkpoint.sections.back().origin < section.origin)) {
            detail::throw_invalid("section ", i, " is out of order or repeated");
          }
          for_each_cache([&](auto traits) {
            using Traits = decltype(traits);
            where = detail::concat("sections[", i, "]");
            json_array(archive, json_name<Traits>(), [&] {
              cereal::size_type count = 0;
              archive.loadSize(count);
              for (cereal::size_type j = 0; j < count; ++j) {
                typename PerfCache<Traits>::Entry entry;
                where = detail::concat("sections[", i, "].", json_name<Traits>(), "[", j, "]");
                archive.startNode();
                archive(cereal::make_nvp("key", entry.first), cereal::make_nvp("ranking", entry.second));
                archive.finishNode();
                append_entry<Traits>(section, std::move(entry), j);
              }
            });
          });
          const auto read_json_plans = [&](auto key) {
            const char* name = plans_name(&key, true);
            where = detail::concat("sections[", i, "]");
            json_array(archive, name, [&] {
              cereal::size_type count = 0;
              archive.loadSize(count);
              for (cereal::size_type j = 0; j < count; ++j) {
                StoredPlan plan;
                where = detail::concat("sections[", i, "].", name, "[", j, "]");
                archive.startNode();
                archive(cereal::make_nvp("key", key), cereal::make_nvp("plan", plan));
                archive.finishNode();
                append_plan(section, key, std::move(plan), j);
              }
            });
          };
          read_json_plans(ConvolutionKey{});
          if (holds_pending(version)) {
            for (const bool graph : {true, false}) {
              json_array(archive, pending_name(graph), [&] {
                cereal::size_type count = 0;
                archive.loadSize(count);
                for (cereal::size_type j = 0; j < count; ++j) {
                  ConvolutionKey key;
                  where = detail::concat("sections[", i, "].", pending_name(graph), "[", j, "]");
                  archive(key);
                  append_pending(section, graph, key, j);
                }
              });
            }
          }
          if (holds_attention(version)) read_json_plans(AttentionKey{});
          archive.finishNode();
          // What deserialize could never give: the bytes of this version have no place for them.
          if (!holds_graph_entries(version) && section.size() != section.forward.size() + section.backward_data.size() +
                                                                     section.backward_filter.size()) {
            detail::throw_invalid("format_version ", version, " cannot hold graph-API entries (section ", i,
                                  " has some); set format_version to ", kFormatVersion);
          }
          if (!holds_plans(version) && !section.plans.empty()) {
            detail::throw_invalid("format_version ", version, " cannot hold stored plans (section ", i,
                                  " has some); set format_version to ", kFormatVersion);
          }
          checkpoint.sections.push_back(std::move(section));
        }
      });
    } catch (const cereal::Exception& e) {  // while the archive can name the field: See Note [Reading a JSON export]
      const std::string problem = json_problem(e, archive.getNodeName());
      if (problem.empty()) throw;
      detail::throw_invalid(where.empty() ? problem : "at " + where + ": " + problem);
    }
  } catch (const std::exception& e) {
    invalid(e.what());
  }

  rapidjson::Document known;
  known.Parse(to_json(checkpoint).c_str());
  if (const std::string unknown = unknown_field(document, known, ""); !unknown.empty()) {
    invalid(unknown, "; remove it, or export a file to see the fields");
  }
  return checkpoint;
}

SaveReport save(const CacheStore& store, const std::string& path, const SaveOptions& options) {
  require_file_target(path);  // before the lock file is made next to it
  const FileLock lock(path, options.lock_timeout_seconds, options.warn);
  SaveReport report;
  report.locked = lock.held();
  struct stat info {};
  if (!options.merge || ::stat(path.c_str(), &info) != 0) {
    const Checkpoint checkpoint = snapshot(store);
    write_file_atomically(path, serialize(checkpoint));
    report.entries = checkpoint.size();
    return report;
  }
  Checkpoint existing;
  try {
    existing = read_checkpoint(path);
  } catch (const Error& e) {
    throw Error(detail::concat("cannot save '", path, "' merged with what it holds: ", e.what(),
                               ". Nothing was written. Move the file aside, or save with merge=False to replace "
                               "it"));
  }
  CacheStore merged;  // the file first, then the store: its stored plans, the newer ones, replace the file's
  merge_into(merged, existing);
  merge_into(merged, snapshot(store));  // a temporary: moved, not copied
  keep_replaced(merged, store);
  const Checkpoint checkpoint = snapshot(merged);
  write_file_atomically(path, serialize(checkpoint));
  report.entries = checkpoint.size();
  report.file_entries = existing.size();
  return report;
}

LoadReport load(CacheStore& store, const std::string& path, const CudnnVersion& running) {
  Checkpoint checkpoint = read_checkpoint(path);
  LoadReport report;
  report.header = checkpoint.header;
  for (const CheckpointSection& section : checkpoint.sections) {
    report.entries += section.size();
    report.plans += section.plans.size() + section.attention.size();
    report.pending += section.pending();
    if (!section.origin.same_cudnn(running)) report.other_cudnn_entries += section.size();
  }
  merge_into(store, std::move(checkpoint));
  return report;
}

}  // namespace cudnn_cache
