#pragma once

// Builder processes: child processes that build runtime-compiled plans for a search's worker threads (Note
// [Builder processes]), and the protocol they speak (Note [Builder protocol]).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cudnn_cache/key.h"
#include "cudnn_cache/plan_store.h"

namespace cudnn_cache {

// Note [Builder processes]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// cuDNN's runtime compilations (NVRTC, 50-250 ms each) serialize inside one process: worker threads building a
// search's runtime-compiled candidates ahead (Note [Parallel candidate builds], graph_search.cpp) made 12
// depthwise keys take 0.84x as long as serial builds on an H200, where 4 separate processes took 0.36x. So a
// worker thread hands each build to a builder process of its own: `cudnn_cache_tool build-plans`, spawned with
// one end of a socketpair as its fd 3. The child makes the same heuristic_graph a worker would, checks that the
// plan at the requested position has the expected name, builds it, and sends it back serialized. The worker
// restores it on its own handle (milliseconds, as a warm start does) and the calling thread times it like any
// other plan: what is timed, and how, does not depend on where a plan was built. The restored plan keeps the
// child's bytes, which the plan store keeps in turn (GraphPlan::serialize), rather than re-serializing a graph
// that was itself deserialized.
//
// Builders may make a search slower, never fail it or hang training, and change what it times only through GPU memory
// (below). A child that cannot start (no tool, no GPU, another cuDNN: its ready frame carries its cuDNN version), dies,
// answers garbage, or does not answer within its timeout is killed and reaped, and that worker builds the candidate in
// its own process as it would have without builders. After kMaxFailures failures in a row on a device, its builders are
// off until another tool is set (a debug log says why). Every frame is checked (Note [Builder protocol]): a malformed
// one is an error of that builder, never a crash. The parent's ends of the sockets are close-on-exec and written with
// MSG_NOSIGNAL, so a dead child raises no SIGPIPE, and no signal disposition of the host process is touched; children
// are reaped by pid only, never with waitpid(-1), which would take the children of others (Python's subprocess) from
// them.
//
// GPU memory: each child holds a CUDA context (about 0.5 GB on an H200) and takes about a second to start (CUDA and
// cuDNN load), so children start only when a search has at least two runtime-compiled candidates to build ahead, one
// per worker of the search (GraphSearchOptions::build_processes), and are kept between searches (a network's keys are
// searched one after another; one still starting when its search ends is kept too). Their memory is the search's less:
// on a GPU nearly full, a candidate whose workspace no longer fits is not timed, which is the one way builders can
// change what a search times (build_processes 0 avoids it). Nor may their memory be the training's: see Note
// [Builders yield GPU memory]. The pool's reaper thread closes a child unused for `idle`
// (5 s), which frees its memory; a child also exits by itself on EOF (its parent closed the socket, or died) or after
// its own, longer, idle timeout, a safety net for a parent that stopped. The child finds its GPU by PCI bus id, which
// does not depend on the order CUDA_VISIBLE_DEVICES gives the devices.

// Note [Builders yield GPU memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A job sized to fit its GPU natively must not run out of memory because builders hold contexts on it (up to 8 x
// 0.5 GB), and they live through the first step's backward pass, its peak. So the device's free memory is kept
// above a floor, memory_floor(total): 10% of the device, at least 2 GiB. A child is not started when starting it
// would take free memory below the floor (no failure is counted). And when the process itself takes free memory
// below it, yield_memory closes every builder of the device, idle or building (SIGKILL; a worker whose builder is
// killed builds its candidate in-process, as after any failure) and waits until each has exited, so that its
// memory is the driver's again; the device's builders are then off until set_executable. The torch ops call
// yield_memory from PyTorch's caching allocator (a FreeCudaMemoryCallback, which runs where the allocator has no
// cached block for a request, before it asks CUDA for more), so it takes effect before the allocation that needs
// the memory. The allocator does not say how much it will ask for: an allocation larger than the floor, made while
// free memory is above the floor but below that size plus the builders' memory, still fails where it would not
// without builders. The floor is above any one activation of common networks at common batch sizes. PyTorch's
// other allocator backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) runs no such callbacks: there only the
// rule for starting a child holds.

// Note [Builder protocol]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Frames, both ways, on a stream socket:
//
//   0         4         6         8                12
//   +---------+---------+---------+----------------+------------------------------+
//   | magic   | version | kind    | length         | payload: `length` bytes,     |
//   | "cCPB"  | 1       | Frame-  | <= kMaxFrame-  | cereal's portable binary     |
//   | u32     | u16     | Kind    | Bytes, u32     | archive                      |
//   +---------+---------+---------+----------------+------------------------------+
//   (header integers little-endian)
//
// child -> parent: ready once started (its cuDNN version), then per request either plan (a StoredPlan: the
//                  config as the child describes it, its cuDNN version, the serialized plan) or error (why not);
// parent -> child: request (BuildRequest).
// A reader checks the magic, version, kind and length before it allocates anything, and a payload is read only
// to its end: a length, count or string that does not fit in it is an error.

namespace builder_protocol {

enum class FrameKind : std::uint16_t { ready = 1, request = 2, plan = 3, error = 4 };

inline constexpr std::uint32_t kMagic = 0x4250'4363;  // "cCPB" in the byte order of the header
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 12;
inline constexpr std::size_t kMaxFrameBytes = kMaxStoredPlanBytes + (std::size_t{1} << 16);
inline constexpr std::size_t kMaxTextBytes = 4096;  // a plan name or an error message

// What a worker asks a builder process for: the plan at `index` of heuristic_graph(key, deterministic), which
// must be named `name`.
struct BuildRequest {
  ConvolutionKey key{};
  bool deterministic = false;
  std::int64_t index = -1;
  std::string name;
};

struct Frame {
  FrameKind kind = FrameKind::error;
  std::vector<std::uint8_t> payload;
};

// A frame as bytes: the header, then the payload. Throws Error if the payload is longer than kMaxFrameBytes.
std::vector<std::uint8_t> encode_frame(FrameKind kind, const std::vector<std::uint8_t>& payload);

// The kind and payload length a header announces. Throws Error saying what is wrong with it.
std::pair<FrameKind, std::size_t> decode_header(const std::uint8_t (&header)[kHeaderBytes]);

// Payloads. The decoders throw Error naming what does not fit; a payload with bytes left over is malformed too.
std::vector<std::uint8_t> encode_request(const BuildRequest& request);
BuildRequest decode_request(const std::vector<std::uint8_t>& payload);
std::vector<std::uint8_t> encode_plan(const StoredPlan& plan);
StoredPlan decode_plan(const std::vector<std::uint8_t>& payload);
std::vector<std::uint8_t> encode_text(const std::string& text);  // error frames
std::string decode_text(const std::vector<std::uint8_t>& payload);
std::vector<std::uint8_t> encode_version(std::uint32_t cudnn_version);  // ready frames
std::uint32_t decode_version(const std::vector<std::uint8_t>& payload);

// One end of a socket, owned: frames sent and received within a timeout. Errors (a timeout, a closed peer, a
// malformed frame) throw Error; after one the stream is out of step and the connection is not used again.
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void send(FrameKind kind, const std::vector<std::uint8_t>& payload, std::chrono::milliseconds timeout);
  // The next frame; nullopt if the peer closed the socket between frames (a clean end).
  std::optional<Frame> receive(std::chrono::milliseconds timeout);
  int fd() const { return fd_; }

 private:
  // Reads exactly `size` bytes before `deadline`; false if the peer closed before the first (when `clean_end`).
  bool read_exactly(std::uint8_t* data, std::size_t size, std::chrono::steady_clock::time_point deadline,
                    bool clean_end);

  int fd_;
};

// The child's side: sends ready (with `cudnn_version`), then answers each request with `build`'s plan, or with
// an error frame carrying the message of what it threw. Returns 0 at EOF or after `idle` without a request, 1
// after a malformed frame or a failed send (the parent then sees the child end and builds in-process).
int serve_plan_builds(int fd, std::uint32_t cudnn_version,
                      const std::function<StoredPlan(const BuildRequest&)>& build, std::chrono::milliseconds idle);

}  // namespace builder_protocol

// One builder process, used by one thread at a time.
class PlanBuilder {
 public:
  // Spawns `command` with one end of a socketpair as its fd 3 and stdin from /dev/null. Throws Error if it
  // cannot be spawned. It is ready once its ready frame has come (ready()), within `start_timeout`.
  PlanBuilder(const std::vector<std::string>& command, std::uint32_t cudnn_version,
              std::chrono::milliseconds start_timeout);
  // Closes the socket, kills the child and reaps it.
  ~PlanBuilder();
  PlanBuilder(const PlanBuilder&) = delete;
  PlanBuilder& operator=(const PlanBuilder&) = delete;

  // Whether the child has started: waits for its ready frame until `stop` is set (false: still starting, ask
  // again later) or the start timeout passes. Throws Error, and failed() is true, if it does not start, or its
  // cuDNN is not the parent's (its plans would not restore here).
  bool ready(const std::atomic<bool>& stop);

  // The plan the child built. Throws Error if it could not build it (it said why; the builder still works) or
  // if the builder failed (failed() is then true: it is not used again).
  StoredPlan build(const builder_protocol::BuildRequest& request, std::chrono::milliseconds timeout);

  bool failed() const { return failed_; }
  // Plans built since the builder was last given back (PlanBuilders::give_back counts them).
  int plans_built() const { return plans_built_; }
  void clear_plans_built() { plans_built_ = 0; }
  pid_t pid() const { return pid_; }
  std::chrono::steady_clock::time_point last_used() const { return last_used_; }
  void touch() { last_used_ = std::chrono::steady_clock::now(); }

  // Which of PlanBuilders' commands started it (PlanBuilders::set_executable counts them).
  std::uint64_t generation = 0;

 private:
  pid_t pid_ = -1;
  std::unique_ptr<builder_protocol::Connection> connection_;
  std::uint32_t cudnn_version_;
  std::chrono::steady_clock::time_point start_deadline_;
  bool ready_ = false;
  bool failed_ = false;
  int plans_built_ = 0;
  std::chrono::steady_clock::time_point last_used_ = std::chrono::steady_clock::now();
};

// The PCI bus id of CUDA device `device`, which names it in every process whatever CUDA_VISIBLE_DEVICES says;
// nullopt if CUDA cannot tell.
std::optional<std::string> pci_bus_id(int device);

// A CUDA device's memory, in bytes.
struct DeviceMemory {
  std::size_t free = 0;
  std::size_t total = 0;
};
// Device `device`'s memory (cudaMemGetInfo), or nullopt where CUDA cannot say.
std::optional<DeviceMemory> device_memory(int device);

// Builder processes, per CUDA device, started on demand (Note [Builder processes]).
class PlanBuilders {
 public:
  struct Settings {
    // The program and its first arguments; `--device-pci-bus-id ID` are appended. Empty: no builders.
    std::vector<std::string> command;
    std::chrono::milliseconds start_timeout{60'000};  // CUDA and cuDNN load in the child
    std::chrono::milliseconds build_timeout{10'000};  // one plan: an NVRTC compilation (50-250 ms), loaded machine
    std::chrono::milliseconds idle{5'000};            // a child unused this long is closed
    // The PCI bus id of a CUDA device (cudaDeviceGetPCIBusId), or nullopt: no builders for it.
    std::function<std::optional<std::string>(int device)> bus_id = pci_bus_id;
    // A device's memory, or nullopt: not known, builders start regardless (Note [Builders yield GPU memory]).
    std::function<std::optional<DeviceMemory>(int device)> memory = device_memory;
  };
  static constexpr int kMaxFailures = 3;
  static constexpr std::size_t kChildMemory = std::size_t{512} << 20;  // a child's CUDA context, about

  // The free memory builders leave a device of `total` bytes (Note [Builders yield GPU memory]).
  static std::size_t memory_floor(std::size_t total);

  // The process's builders: `cudnn_cache_tool build-plans`, where set_executable (the Python package does) or
  // the CUDNN_CACHE_TOOL environment variable names the tool; without either, none. Never destroyed: at exit
  // the children see their sockets close and end.
  static PlanBuilders& instance();

  explicit PlanBuilders(Settings settings);
  // Closes every idle child; builders still taken are closed by their holders.
  ~PlanBuilders();
  PlanBuilders(const PlanBuilders&) = delete;
  PlanBuilders& operator=(const PlanBuilders&) = delete;

  // The builder command becomes `path build-plans`; "" turns builders off. Children of the previous command
  // are closed (those in use when they are given back), and the devices' failures forgotten.
  void set_executable(const std::string& path);

  // A builder for CUDA device `device`: an idle one, or one started now. Null when there is no command, the
  // device's builders are off after kMaxFailures failures in a row, or one cannot start (counted as a failure).
  std::unique_ptr<PlanBuilder> take(int device);
  // Returns a builder taken from take(): kept for the next search unless it failed, when it is closed and
  // counted as a failure of its device; one that built a plan clears the device's count.
  void give_back(int device, std::unique_ptr<PlanBuilder> builder);

  const Settings& settings() const { return settings_; }
  // Children running now (idle or taken), for tests.
  std::size_t running() const;
  // Whether the device's builders are off after kMaxFailures failures in a row.
  bool disabled(int device) const;
  // Whether take(device) may give a builder: there is a command, and the device's builders are not off.
  bool available(int device) const;
  // Plans builders have built and sent, counted as they are given back; for tests.
  std::uint64_t plans_built() const;
  // Note [Builders yield GPU memory]: where the device runs builders and its free memory is below the floor,
  // closes them all, waits until they have exited, turns the device's builders off until set_executable, and
  // returns true. A device without builders costs a lock and no CUDA call.
  bool yield_memory(int device);

 private:
  void reap_idle();  // the reaper thread's loop
  bool off(int device) const;  // disabled(device), under mutex_, or after yield_memory

  Settings settings_;  // command guarded by mutex_
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a builder became idle, or the pool stops
  bool stopping_ = false;
  std::map<int, std::vector<std::unique_ptr<PlanBuilder>>> idle_;  // by device
  std::map<int, int> failures_;                                    // in a row, by device
  std::map<int, std::vector<pid_t>> taken_;  // children taken from the pool (idle or starting), by device
  std::set<int> yielded_;                    // devices whose builders yield_memory closed
  std::size_t running_ = 0;
  std::uint64_t plans_built_ = 0;
  std::uint64_t generation_ = 0;  // of settings_.command
  std::thread reaper_;  // started with the first child
};

}  // namespace cudnn_cache
