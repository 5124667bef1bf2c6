// Builder processes and their protocol: Notes [Builder processes] and [Builder protocol] in plan_builders.h.

#include "plan_builders.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <tuple>
#include <utility>

#include "cudnn_cache/error.h"
#include "cudnn_cache/runtime.h"
#include "cudnn_cache/serialization.h"

extern char** environ;

namespace cudnn_cache {
namespace builder_protocol {
namespace {

using Clock = std::chrono::steady_clock;

std::string kind_name(FrameKind kind) {
  switch (kind) {
    case FrameKind::ready: return "ready";
    case FrameKind::request: return "request";
    case FrameKind::plan: return "plan";
    case FrameKind::error: return "error";
  }
  return "unknown";
}

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left, 1'000'000)));
}

// Whether `fd` has something to read (data, or the peer's end) within `timeout_ms`.
bool readable_within(int fd, int timeout_ms) {
  pollfd entry{fd, POLLIN, 0};
  int ready = 0;
  while ((ready = poll(&entry, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  return ready > 0;
}

void put_le(std::uint8_t* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}

std::uint64_t get_le(const std::uint8_t* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return value;
}

template <typename Save>
std::vector<std::uint8_t> encode(Save save) {
  std::ostringstream stream(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive archive(stream);
    save(archive);
  }
  const std::string bytes = stream.str();
  return {bytes.begin(), bytes.end()};
}

// Reads a payload with `load`, which must use all of it. cereal's errors (a short read) become Error.
template <typename Load>
auto decode(const std::vector<std::uint8_t>& payload, FrameKind kind, Load load) {
  std::istringstream stream(std::string(payload.begin(), payload.end()), std::ios::binary);
  try {
    cereal::PortableBinaryInputArchive archive(stream);
    auto value = load(archive);
    CUDNN_CACHE_REQUIRE(stream.peek() == std::char_traits<char>::eof(), "plan builder protocol: a ",
                        kind_name(kind), " frame with bytes after its end");
    return value;
  } catch (const cereal::Exception& e) {
    throw Error(detail::concat("plan builder protocol: malformed ", kind_name(kind), " frame (", e.what(), ")"));
  }
}

// A string of at most kMaxTextBytes, its length first: cereal's own string load would allocate any length.
void save_text(cereal::PortableBinaryOutputArchive& archive, const std::string& text) {
  const std::size_t size = std::min(text.size(), kMaxTextBytes);
  archive(cereal::make_size_tag(static_cast<cereal::size_type>(size)), cereal::binary_data(text.data(), size));
}

std::string load_text(cereal::PortableBinaryInputArchive& archive) {
  cereal::size_type size = 0;
  archive(cereal::make_size_tag(size));
  if (size > kMaxTextBytes) detail::throw_invalid("text of ", size, " bytes (at most ", kMaxTextBytes, ")");
  std::string text(static_cast<std::size_t>(size), '\0');
  archive(cereal::binary_data(text.data(), text.size()));
  return text;
}

}  // namespace

std::vector<std::uint8_t> encode_frame(FrameKind kind, const std::vector<std::uint8_t>& payload) {
  CUDNN_CACHE_REQUIRE(payload.size() <= kMaxFrameBytes, "plan builder protocol: a ", kind_name(kind), " frame of ",
                      payload.size(), " bytes is over the limit of ", kMaxFrameBytes);
  std::vector<std::uint8_t> frame(kHeaderBytes + payload.size());
  put_le(frame.data(), kMagic, 4);
  put_le(frame.data() + 4, kVersion, 2);
  put_le(frame.data() + 6, static_cast<std::uint16_t>(kind), 2);
  put_le(frame.data() + 8, payload.size(), 4);
  std::copy(payload.begin(), payload.end(), frame.begin() + kHeaderBytes);
  return frame;
}

std::pair<FrameKind, std::size_t> decode_header(const std::uint8_t (&header)[kHeaderBytes]) {
  const std::uint64_t magic = get_le(header, 4), version = get_le(header + 4, 2), kind = get_le(header + 6, 2);
  const std::uint64_t length = get_le(header + 8, 4);
  CUDNN_CACHE_REQUIRE(magic == kMagic, "plan builder protocol: not a frame (magic 0x", std::hex, magic, std::dec,
                      "); is the builder command cudnn_cache_tool build-plans?");
  CUDNN_CACHE_REQUIRE(version == kVersion, "plan builder protocol: version ", version, ", expected ", kVersion,
                      ": the builder is another cudnn_cache_tool than this library's; reinstall cudnn_cache");
  CUDNN_CACHE_REQUIRE(kind >= static_cast<std::uint64_t>(FrameKind::ready) &&
                          kind <= static_cast<std::uint64_t>(FrameKind::error),
                      "plan builder protocol: unknown frame kind ", kind);
  CUDNN_CACHE_REQUIRE(length <= kMaxFrameBytes, "plan builder protocol: a frame of ", length,
                      " bytes is over the limit of ", kMaxFrameBytes);
  return {static_cast<FrameKind>(kind), static_cast<std::size_t>(length)};
}

std::vector<std::uint8_t> encode_request(const BuildRequest& request) {
  return encode([&](cereal::PortableBinaryOutputArchive& archive) {
    ConvolutionKey key = request.key;
    archive(key, static_cast<std::uint8_t>(request.deterministic), request.index);
    save_text(archive, request.name);
  });
}

BuildRequest decode_request(const std::vector<std::uint8_t>& payload) {
  BuildRequest request = decode(payload, FrameKind::request, [](cereal::PortableBinaryInputArchive& archive) {
    BuildRequest loaded;
    std::uint8_t deterministic = 0;
    archive(loaded.key, deterministic, loaded.index);
    if (deterministic > 1) detail::throw_invalid("deterministic flag ", static_cast<int>(deterministic));
    if (loaded.index < 0 || loaded.index > kMaxHeuristicIndex) detail::throw_invalid("plan index ", loaded.index);
    loaded.deterministic = deterministic == 1;
    loaded.name = load_text(archive);
    return loaded;
  });
  const std::string problem = check_key(request.key);
  CUDNN_CACHE_REQUIRE(problem.empty(), "plan builder protocol: a request for an invalid key (", problem, ")");
  return request;
}

std::vector<std::uint8_t> encode_plan(const StoredPlan& plan) {
  return encode([&](cereal::PortableBinaryOutputArchive& archive) { archive(plan); });
}

StoredPlan decode_plan(const std::vector<std::uint8_t>& payload) {
  return decode(payload, FrameKind::plan, [](cereal::PortableBinaryInputArchive& archive) {
    StoredPlan plan;
    archive(plan);
    return plan;
  });
}

std::vector<std::uint8_t> encode_text(const std::string& text) {
  return encode([&](cereal::PortableBinaryOutputArchive& archive) { save_text(archive, text); });
}

std::string decode_text(const std::vector<std::uint8_t>& payload) {
  return decode(payload, FrameKind::error, [](cereal::PortableBinaryInputArchive& archive) {
    return load_text(archive);
  });
}

std::vector<std::uint8_t> encode_version(std::uint32_t cudnn_version) {
  return encode([&](cereal::PortableBinaryOutputArchive& archive) { archive(cudnn_version); });
}

std::uint32_t decode_version(const std::vector<std::uint8_t>& payload) {
  return decode(payload, FrameKind::ready, [](cereal::PortableBinaryInputArchive& archive) {
    std::uint32_t version = 0;
    archive(version);
    return version;
  });
}

Connection::~Connection() {
  if (fd_ >= 0) close(fd_);
}

void Connection::send(FrameKind kind, const std::vector<std::uint8_t>& payload, std::chrono::milliseconds timeout) {
  const std::vector<std::uint8_t> frame = encode_frame(kind, payload);
  const Clock::time_point deadline = Clock::now() + timeout;
  for (std::size_t sent = 0; sent < frame.size();) {
    // MSG_NOSIGNAL: a closed peer is an EPIPE here, not a SIGPIPE for the whole process.
    const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    CUDNN_CACHE_REQUIRE(n < 0 && errno != EPIPE && errno != ECONNRESET, "plan builder: the other end ended (",
                        std::strerror(errno), ")");
    CUDNN_CACHE_REQUIRE(errno == EAGAIN || errno == EWOULDBLOCK, "plan builder: cannot send a ", kind_name(kind),
                        " frame (", std::strerror(errno), ")");
    pollfd entry{fd_, POLLOUT, 0};
    const int timeout_ms = milliseconds_until(deadline);
    CUDNN_CACHE_REQUIRE(timeout_ms > 0 && poll(&entry, 1, timeout_ms) >= 0, "plan builder: sending a ",
                        kind_name(kind), " frame timed out after ", timeout.count(), " ms");
  }
}

bool Connection::read_exactly(std::uint8_t* data, std::size_t size, Clock::time_point deadline, bool clean_end) {
  for (std::size_t read = 0; read < size;) {
    CUDNN_CACHE_REQUIRE(readable_within(fd_, milliseconds_until(deadline)),
                        "plan builder: no answer within the timeout");
    const ssize_t n = recv(fd_, data + read, size - read, MSG_DONTWAIT);
    if (n > 0) {
      read += static_cast<std::size_t>(n);
    } else if (n == 0) {
      if (clean_end && read == 0) return false;
      throw Error(detail::concat("plan builder: the other end closed in the middle of a frame (", read, " of ",
                                 size, " bytes)"));
    } else {
      CUDNN_CACHE_REQUIRE(errno != ECONNRESET, "plan builder: the other end ended (", std::strerror(errno), ")");
      CUDNN_CACHE_REQUIRE(errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK, "plan builder: cannot read (",
                          std::strerror(errno), ")");
    }
  }
  return true;
}

std::optional<Frame> Connection::receive(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::uint8_t header[kHeaderBytes];
  if (!read_exactly(header, kHeaderBytes, deadline, /*clean_end=*/true)) return std::nullopt;
  Frame frame;
  std::size_t length = 0;
  std::tie(frame.kind, length) = decode_header(header);
  frame.payload.resize(length);
  read_exactly(frame.payload.data(), length, deadline, /*clean_end=*/false);
  return frame;
}

int serve_plan_builds(int fd, std::uint32_t cudnn_version,
                      const std::function<StoredPlan(const BuildRequest&)>& build, std::chrono::milliseconds idle) {
  constexpr std::chrono::milliseconds kFrameTimeout{10'000};  // once a frame has begun, the rest follows at once
  Connection connection(fd);
  try {
    connection.send(FrameKind::ready, encode_version(cudnn_version), kFrameTimeout);
    while (readable_within(fd, static_cast<int>(idle.count()))) {
      const std::optional<Frame> frame = connection.receive(kFrameTimeout);
      if (!frame) return 0;  // the parent closed: done
      CUDNN_CACHE_REQUIRE(frame->kind == FrameKind::request, "plan builder protocol: a ", kind_name(frame->kind),
                          " frame where a request was expected");
      const BuildRequest request = decode_request(frame->payload);
      std::optional<StoredPlan> plan;
      std::string why;
      try {
        plan = build(request);
      } catch (const std::exception& e) {  // Error, or what cudnn-frontend lets escape: an answer, not an end
        why = e.what();
      }
      if (plan) {
        connection.send(FrameKind::plan, encode_plan(*plan), kFrameTimeout);
      } else {
        connection.send(FrameKind::error, encode_text(why), kFrameTimeout);
      }
    }
    return 0;  // idle: the parent has no more use for this process
  } catch (const Error& e) {
    std::fprintf(stderr, "cudnn_cache_tool build-plans: %s\n", e.what());
    return 1;
  }
}

}  // namespace builder_protocol

using namespace builder_protocol;

namespace {

// Logs at debug level: builders never fail a search, so what went wrong is only worth a debug line.
template <typename... Args>
void debug(const Args&... args) {
  Runtime& runtime = Runtime::instance();
  if (runtime.logs(LogLevel::debug)) runtime.log(LogLevel::debug, detail::concat("plan builders: ", args...));
}

// Spawns `command` with `child_end` as its fd 3, stdin from /dev/null, and the parent's environment. posix_spawn
// is safe in a threaded process (no fork of the parent's threads and locks).
pid_t spawn(const std::vector<std::string>& command, int child_end) {
  CUDNN_CACHE_REQUIRE(!command.empty(), "plan builders: no builder command");
  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_end, 3);  // child_end > 3: the copy loses close-on-exec
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  posix_spawn_file_actions_addclosefrom_np(&actions, 4);  // no other descriptor of the parent's leaks into it
#endif
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);  // not the spawning thread's mask
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int status = posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  CUDNN_CACHE_REQUIRE(status == 0, "plan builders: cannot start '", command[0], "' (", std::strerror(status),
                      "); set the tool with cudnn_cache's set_plan_builder or CUDNN_CACHE_TOOL");
  return pid;
}

}  // namespace

PlanBuilder::PlanBuilder(const std::vector<std::string>& command, std::uint32_t cudnn_version,
                         std::chrono::milliseconds start_timeout)
    : cudnn_version_(cudnn_version), start_deadline_(Clock::now() + start_timeout) {
  int ends[2];
  CUDNN_CACHE_REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) == 0,
                      "plan builders: socketpair failed (", std::strerror(errno), ")");
  connection_ = std::make_unique<Connection>(ends[0]);
  // Above 3, so that dup2 onto 3 in the child makes a copy (which drops close-on-exec) rather than a no-op.
  const int child_end = fcntl(ends[1], F_DUPFD_CLOEXEC, 4);
  close(ends[1]);
  CUDNN_CACHE_REQUIRE(child_end >= 0, "plan builders: fcntl failed (", std::strerror(errno), ")");
  try {
    pid_ = spawn(command, child_end);
  } catch (const Error&) {
    close(child_end);
    throw;
  }
  close(child_end);
}

PlanBuilder::~PlanBuilder() {
  connection_.reset();  // a child between requests sees the end and exits; the kill covers the rest
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

bool PlanBuilder::ready(const std::atomic<bool>& stop) {
  constexpr int kSliceMs = 20;  // how often a start is checked for `stop`
  if (ready_) return true;
  CUDNN_CACHE_REQUIRE(!failed_, "plan builders: this builder failed");
  try {
    for (;;) {
      const int left = milliseconds_until(start_deadline_);
      CUDNN_CACHE_REQUIRE(left > 0, "plan builders: the builder (pid ", pid_, ") did not start in time");
      if (readable_within(connection_->fd(), std::min(left, kSliceMs))) break;
      if (stop.load()) return false;
    }
    const std::optional<Frame> frame = connection_->receive(std::chrono::milliseconds(kSliceMs * 50));
    CUDNN_CACHE_REQUIRE(frame, "plan builders: the builder (pid ", pid_, ") ended as it started (no GPU, or no "
                        "cuDNN? its stderr says)");
    CUDNN_CACHE_REQUIRE(frame->kind == FrameKind::ready, "plan builder protocol: a ", kind_name(frame->kind),
                        " frame where ready was expected");
    const std::uint32_t version = decode_version(frame->payload);
    CUDNN_CACHE_REQUIRE(version == cudnn_version_, "plan builders: the builder loaded cuDNN ", version,
                        " where this process has ", cudnn_version_, "; its plans would not restore here");
  } catch (const Error& e) {
    failed_ = true;
    debug(e.what());
    throw;
  }
  ready_ = true;
  return true;
}

StoredPlan PlanBuilder::build(const BuildRequest& request, std::chrono::milliseconds timeout) {
  CUDNN_CACHE_REQUIRE(ready_ && !failed_, "plan builders: build() on a builder that is not ready");
  std::optional<Frame> frame;
  try {
    connection_->send(FrameKind::request, encode_request(request), timeout);
    frame = connection_->receive(timeout);
    CUDNN_CACHE_REQUIRE(frame, "plan builders: the builder (pid ", pid_, ") ended");
    if (frame->kind == FrameKind::plan) {
      StoredPlan plan = decode_plan(frame->payload);
      ++plans_built_;
      return plan;
    }
    CUDNN_CACHE_REQUIRE(frame->kind == FrameKind::error, "plan builder protocol: a ", kind_name(frame->kind),
                        " frame where a plan was expected");
  } catch (const Error& e) {
    failed_ = true;
    debug(e.what());
    throw;
  }
  throw Error(decode_text(frame->payload));  // the builder could not build it, and said why
}

std::optional<std::string> pci_bus_id(int device) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) return std::nullopt;
  return std::string(bus_id);
}

std::optional<DeviceMemory> device_memory(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) return std::nullopt;
  if (current != device && cudaSetDevice(device) != cudaSuccess) return std::nullopt;
  DeviceMemory memory;
  const bool known = cudaMemGetInfo(&memory.free, &memory.total) == cudaSuccess;
  if (current != device) cudaSetDevice(current);
  if (!known) return std::nullopt;
  return memory;
}

std::size_t PlanBuilders::memory_floor(std::size_t total) {
  return std::max(total / 10, std::size_t{2} << 30);
}

PlanBuilders& PlanBuilders::instance() {
  static PlanBuilders* builders = [] {
    Settings settings;
    if (const char* tool = std::getenv("CUDNN_CACHE_TOOL"); tool && *tool) settings.command = {tool, "build-plans"};
    return new PlanBuilders(settings);
  }();
  return *builders;
}

PlanBuilders::PlanBuilders(Settings settings) : settings_(std::move(settings)) {}

PlanBuilders::~PlanBuilders() {
  std::map<int, std::vector<std::unique_ptr<PlanBuilder>>> idle;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    idle.swap(idle_);
  }
  changed_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void PlanBuilders::set_executable(const std::string& path) {
  std::map<int, std::vector<std::unique_ptr<PlanBuilder>>> idle;  // closed after the lock is released
  std::lock_guard lock(mutex_);
  settings_.command = path.empty() ? std::vector<std::string>{} : std::vector<std::string>{path, "build-plans"};
  ++generation_;
  failures_.clear();
  yielded_.clear();
  for (const auto& [device, builders] : idle_) running_ -= builders.size();
  idle.swap(idle_);  // children of another tool, or none wanted
}

std::unique_ptr<PlanBuilder> PlanBuilders::take(int device) {
  std::vector<std::string> command;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    std::vector<std::unique_ptr<PlanBuilder>>& idle = idle_[device];
    if (!idle.empty()) {
      std::unique_ptr<PlanBuilder> builder = std::move(idle.back());
      idle.pop_back();
      taken_[device].push_back(builder->pid());
      return builder;
    }
    if (settings_.command.empty() || off(device)) return nullptr;
    command = settings_.command;
    generation = generation_;
  }
  const std::optional<std::string> bus_id = settings_.bus_id(device);
  if (!bus_id) {
    debug("no PCI bus id for CUDA device ", device, ": building in-process");
    return nullptr;
  }
  if (const std::optional<DeviceMemory> memory = settings_.memory(device);
      memory && memory->free < memory_floor(memory->total) + kChildMemory) {
    debug("CUDA device ", device, " has ", memory->free >> 20, " MiB free: no builder started (Note [Builders yield "
          "GPU memory])");
    return nullptr;
  }
  command.insert(command.end(), {"--device-pci-bus-id", *bus_id});
  try {
    auto builder = std::make_unique<PlanBuilder>(command, static_cast<std::uint32_t>(cudnnGetVersion()),
                                                 settings_.start_timeout);
    builder->generation = generation;
    std::lock_guard lock(mutex_);
    ++running_;
    taken_[device].push_back(builder->pid());
    if (!reaper_.joinable()) reaper_ = std::thread([this] { reap_idle(); });
    return builder;
  } catch (const std::exception& e) {  // Error, or no thread for the reaper
    int failures = 0;
    {
      std::lock_guard lock(mutex_);
      failures = ++failures_[device];
    }
    debug(e.what(), failures >= kMaxFailures ? "; builders are off for this device" : "");
    return nullptr;
  }
}

void PlanBuilders::give_back(int device, std::unique_ptr<PlanBuilder> builder) {
  if (!builder) return;
  std::unique_lock lock(mutex_);
  std::vector<pid_t>& taken = taken_[device];
  taken.erase(std::remove(taken.begin(), taken.end(), builder->pid()), taken.end());
  const int built = builder->plans_built();
  builder->clear_plans_built();
  plans_built_ += static_cast<std::uint64_t>(built);
  const bool current = builder->generation == generation_ && yielded_.count(device) == 0;  // else closed, no failure
  if (!builder->failed() && current) {
    if (built > 0) failures_[device] = 0;
    builder->touch();
    idle_[device].push_back(std::move(builder));
    changed_.notify_all();  // the reaper closes it once idle
    return;
  }
  --running_;
  const int failures = current ? ++failures_[device] : 0;
  lock.unlock();  // logs and kills outside the lock
  if (current) {
    debug("closing builder ", builder->pid(), " of device ", device, " after a failure",
          failures >= kMaxFailures ? "; builders are off for this device" : "");
  }
  builder.reset();  // kills and reaps
}

std::size_t PlanBuilders::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

std::uint64_t PlanBuilders::plans_built() const {
  std::lock_guard lock(mutex_);
  return plans_built_;
}

bool PlanBuilders::off(int device) const {
  if (yielded_.count(device) != 0) return true;
  const auto found = failures_.find(device);
  return found != failures_.end() && found->second >= kMaxFailures;
}

bool PlanBuilders::yield_memory(int device) {
  {
    std::lock_guard lock(mutex_);
    const auto idle = idle_.find(device);
    const auto taken = taken_.find(device);
    if ((idle == idle_.end() || idle->second.empty()) && (taken == taken_.end() || taken->second.empty())) {
      return false;
    }
  }
  const std::optional<DeviceMemory> memory = settings_.memory(device);  // outside the lock: it calls into CUDA
  if (!memory || memory->free >= memory_floor(memory->total)) return false;
  std::vector<std::unique_ptr<PlanBuilder>> idle;
  std::vector<pid_t> taken;
  {
    std::lock_guard lock(mutex_);
    yielded_.insert(device);
    idle.swap(idle_[device]);
    running_ -= idle.size();
    // Their holders give them back, and give_back closes them. Killed under the lock, which give_back takes
    // before its holder reaps a child, and only if still a running child of this process: so never a pid that
    // was reaped (and may name another process now), even from a holder that dropped its builder unreturned.
    for (const pid_t pid : taken_[device]) {
      siginfo_t info{};
      if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0) {
        kill(pid, SIGKILL);
        taken.push_back(pid);
      }
    }
  }
  debug("CUDA device ", device, " has ", memory->free >> 20, " MiB free of ", memory->total >> 20,
        ": closing its ", idle.size() + taken.size(), " builders, off from now on (Note [Builders yield GPU memory])");
  idle.clear();  // kills and reaps
  // A taken child is its holder's to reap; waiting for its exit without reaping it (WNOWAIT) is enough, since
  // an exited process's GPU memory is the driver's again. A holder that reaped it first ends the wait (ECHILD).
  constexpr auto kExitTimeout = std::chrono::seconds(2);
  const Clock::time_point deadline = Clock::now() + kExitTimeout;
  for (const pid_t pid : taken) {
    for (;;) {
      siginfo_t info{};
      if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == pid) break;
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return true;
}

bool PlanBuilders::disabled(int device) const {
  std::lock_guard lock(mutex_);
  return off(device);
}

bool PlanBuilders::available(int device) const {
  std::lock_guard lock(mutex_);
  return !settings_.command.empty() && !off(device);
}

void PlanBuilders::reap_idle() {
  constexpr std::chrono::milliseconds kTick{250};
  const auto any_idle = [&] {
    return std::any_of(idle_.begin(), idle_.end(), [](const auto& device) { return !device.second.empty(); });
  };
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (any_idle()) {
      changed_.wait_for(lock, kTick);
    } else {
      changed_.wait(lock, [&] { return stopping_ || any_idle(); });  // nothing to close: no wake-ups
    }
    std::vector<std::unique_ptr<PlanBuilder>> expired;
    const Clock::time_point now = Clock::now();
    for (auto& [device, idle] : idle_) {
      for (auto it = idle.begin(); it != idle.end();) {
        if (now - (*it)->last_used() < settings_.idle) {
          ++it;
          continue;
        }
        expired.push_back(std::move(*it));
        it = idle.erase(it);
        --running_;
      }
    }
    lock.unlock();
    expired.clear();  // kills and reaps, outside the lock
    lock.lock();
  }
}

}  // namespace cudnn_cache
