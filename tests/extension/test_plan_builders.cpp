// Builder processes without a GPU: the protocol (Note [Builder protocol]), the serving loop with a stand-in
// build, children that die, hang or answer garbage (Note [Builder processes]), and the prefetcher's queue and
// results on such children (Note [Prefetched builds]). The GPU suite checks that a
// search with builder processes times what it times without them.

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache_fixtures.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"
#include "plan_builders.h"
#include "plan_prefetch.h"

namespace {

using namespace cudnn_cache;
using namespace cudnn_cache::builder_protocol;
using Catch::Matchers::Contains;
using std::chrono::milliseconds;

// A request as a search's worker makes it, for a bf16 channels-last key.
BuildRequest request() {
  return {testing::conv_key(Direction::forward, 8, 32, Layout::nhwc, CUDNN_DATA_BFLOAT16), true, 7,
          "eng12_k2=3_k3=0"};
}

StoredPlan plan() {
  StoredPlan made;
  made.config.engine_id = 12;
  made.config.knob_count = 1;
  made.config.knobs[0] = {2, 3};
  made.config.heuristic_index = 7;
  made.cudnn_version = 91000;
  made.bytes = {1, 2, 3, 4, 5};
  return made;
}

std::vector<std::uint8_t> without_last_byte(std::vector<std::uint8_t> bytes) {
  bytes.pop_back();
  return bytes;
}

std::pair<FrameKind, std::size_t> header_of(const std::vector<std::uint8_t>& frame) {
  std::uint8_t header[kHeaderBytes];
  std::copy(frame.begin(), frame.begin() + kHeaderBytes, header);
  return decode_header(header);
}

struct SocketPair {
  int ends[2] = {-1, -1};
  SocketPair() { REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) == 0); }
};

// A file holding a frame, for shell children to send with cat.
std::string frame_file(const std::string& name, const std::vector<std::uint8_t>& frame) {
  const std::string path = (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()))).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(frame.data()), frame.size());
  return path;
}

// A child running `script` under /bin/sh; the builder arguments the pool appends become $1...
std::vector<std::string> shell(const std::string& script) { return {"/bin/sh", "-c", script, "sh"}; }

// Whether `pid` names a process (a living one or an unreaped zombie).
bool exists(pid_t pid) { return kill(pid, 0) == 0; }

constexpr std::uint32_t kVersion91 = 91000;

}  // namespace

TEST_CASE("builder protocol: frames and payloads round trip", "[plan_builders]") {
  const BuildRequest sent = request();
  const BuildRequest received = decode_request(encode_request(sent));
  CHECK(received.key == sent.key);
  CHECK(received.deterministic);
  CHECK(received.index == 7);
  CHECK(received.name == sent.name);
  CHECK(decode_plan(encode_plan(plan())) == plan());
  CHECK(decode_text(encode_text("NOT_SUPPORTED")) == "NOT_SUPPORTED");
  CHECK(decode_version(encode_version(kVersion91)) == kVersion91);

  const std::vector<std::uint8_t> payload = encode_request(sent);
  const std::vector<std::uint8_t> frame = encode_frame(FrameKind::request, payload);
  REQUIRE(frame.size() == kHeaderBytes + payload.size());
  CHECK(header_of(frame) == std::make_pair(FrameKind::request, payload.size()));
  CHECK(std::equal(payload.begin(), payload.end(), frame.begin() + kHeaderBytes));
}

TEST_CASE("builder protocol: malformed headers and payloads are errors that say what is wrong", "[plan_builders]") {
  std::vector<std::uint8_t> frame = encode_frame(FrameKind::plan, {});
  SECTION("magic") {
    frame[0] ^= 0xff;
    CHECK_THROWS_WITH(header_of(frame), Contains("not a frame"));
  }
  SECTION("version") {
    frame[4] = 9;
    CHECK_THROWS_WITH(header_of(frame), Contains("version 9, expected 1"));
  }
  SECTION("kind") {
    frame[6] = 77;
    CHECK_THROWS_WITH(header_of(frame), Contains("unknown frame kind 77"));
  }
  SECTION("length over the limit") {
    frame[11] = 0xff;
    CHECK_THROWS_WITH(header_of(frame), Contains("over the limit"));
  }
  SECTION("truncated payloads") {
    CHECK_THROWS_WITH(decode_request(without_last_byte(encode_request(request()))),
                      Contains("malformed request frame"));
    CHECK_THROWS_WITH(decode_plan(without_last_byte(encode_plan(plan()))), Contains("malformed plan frame"));
    CHECK_THROWS_WITH(decode_version({}), Contains("malformed ready frame"));
  }
  SECTION("bytes after the end") {
    std::vector<std::uint8_t> payload = encode_text("why");
    payload.push_back(0);
    CHECK_THROWS_WITH(decode_text(payload), Contains("bytes after its end"));
  }
  SECTION("a text longer than the limit") {
    std::vector<std::uint8_t> payload = encode_text("x");
    payload[1] = 0xff;  // the size tag after the archive's one-byte endianness mark: 255 + x
    payload[2] = 0xff;
    CHECK_THROWS_WITH(decode_text(payload), Contains("text of 65535 bytes"));
  }
  SECTION("a request's values are checked") {
    BuildRequest bad = request();
    bad.index = -1;
    CHECK_THROWS_WITH(decode_request(encode_request(bad)), Contains("plan index -1"));
    bad = request();
    bad.key.input.nb_dims = 99;
    CHECK_THROWS_WITH(decode_request(encode_request(bad)), Contains("invalid key"));
  }
}

TEST_CASE("builder protocol: every truncation and random corruption of a payload decodes or throws Error",
          "[plan_builders]") {
  // What a fuzzer would look for first: no length, count or value read from the bytes may crash a decoder or
  // make it allocate without bound (Note [Builder protocol]).
  const auto decodes_or_throws_error = [](const std::vector<std::uint8_t>& payload) {
    for (const auto& decoder : std::vector<std::function<void(const std::vector<std::uint8_t>&)>>{
             [](const auto& bytes) { decode_request(bytes); }, [](const auto& bytes) { decode_plan(bytes); },
             [](const auto& bytes) { decode_text(bytes); }, [](const auto& bytes) { decode_version(bytes); }}) {
      try {
        decoder(payload);
      } catch (const Error&) {
      }
    }
  };
  std::mt19937 random(16);
  for (const std::vector<std::uint8_t>& valid :
       {encode_request(request()), encode_plan(plan()), encode_text("NOT_SUPPORTED"), encode_version(kVersion91)}) {
    for (std::size_t size = 0; size <= valid.size(); ++size) {
      decodes_or_throws_error(std::vector<std::uint8_t>(valid.begin(), valid.begin() + size));
    }
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<std::uint8_t> corrupt = valid;
      for (int flips = 1 + trial % 4; flips > 0; --flips) {
        corrupt[random() % corrupt.size()] = static_cast<std::uint8_t>(random());
      }
      decodes_or_throws_error(corrupt);
    }
  }
}

TEST_CASE("builder protocol: a connection reads whole frames, and says when the other end fails", "[plan_builders]") {
  SocketPair sockets;
  Connection parent(sockets.ends[0]);
  {
    Connection child(sockets.ends[1]);
    child.send(FrameKind::ready, encode_version(kVersion91), milliseconds(1000));
    const std::optional<Frame> frame = parent.receive(milliseconds(1000));
    REQUIRE(frame);
    CHECK(frame->kind == FrameKind::ready);
    CHECK(decode_version(frame->payload) == kVersion91);
    CHECK_THROWS_WITH(parent.receive(milliseconds(50)), Contains("no answer within the timeout"));
    // Half a frame, then the end.
    const std::vector<std::uint8_t> half = encode_frame(FrameKind::error, encode_text("half"));
    REQUIRE(::send(child.fd(), half.data(), half.size() / 2, MSG_NOSIGNAL) > 0);
  }
  CHECK_THROWS_WITH(parent.receive(milliseconds(1000)), Contains("closed in the middle of a frame"));
  CHECK_FALSE(parent.receive(milliseconds(1000)));  // then the clean end
  // Writing to a closed peer is an error, not a SIGPIPE that ends the test binary.
  CHECK_THROWS_WITH(parent.send(FrameKind::request, encode_request(request()), milliseconds(1000)),
                    Contains("the other end ended"));
}

TEST_CASE("builder protocol: the child's loop answers each request, and ends at EOF, when idle or on garbage",
          "[plan_builders]") {
  SocketPair sockets;
  Connection parent(sockets.ends[0]);
  const auto build = [](const BuildRequest& asked) {
    if (asked.index != 7) {
      throw Error("cuDNN graph API: heuristics' plan #" + std::to_string(asked.index) + " is not that");
    }
    return plan();
  };
  std::future<int> served = std::async(std::launch::async, [&] {
    return serve_plan_builds(sockets.ends[1], kVersion91, build, milliseconds(30'000));
  });
  std::optional<Frame> frame = parent.receive(milliseconds(5000));
  REQUIRE(frame);
  CHECK(frame->kind == FrameKind::ready);
  parent.send(FrameKind::request, encode_request(request()), milliseconds(1000));
  frame = parent.receive(milliseconds(5000));
  REQUIRE(frame);
  REQUIRE(frame->kind == FrameKind::plan);
  CHECK(decode_plan(frame->payload) == plan());
  BuildRequest other = request();
  other.index = 8;
  parent.send(FrameKind::request, encode_request(other), milliseconds(1000));
  frame = parent.receive(milliseconds(5000));
  REQUIRE(frame);
  REQUIRE(frame->kind == FrameKind::error);
  CHECK(decode_text(frame->payload) == "cuDNN graph API: heuristics' plan #8 is not that");

  SECTION("EOF ends it with status 0") {
    ::shutdown(parent.fd(), SHUT_WR);
    REQUIRE(served.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
    CHECK(served.get() == 0);
  }
  SECTION("garbage ends it with status 1") {
    const char garbage[kHeaderBytes] = "not a frame";
    REQUIRE(::send(parent.fd(), garbage, sizeof garbage, MSG_NOSIGNAL) == sizeof garbage);
    REQUIRE(served.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
    CHECK(served.get() == 1);
  }
}

TEST_CASE("builder protocol: an idle child ends by itself", "[plan_builders]") {
  SocketPair sockets;
  Connection parent(sockets.ends[0]);
  const auto started = std::chrono::steady_clock::now();
  const int status = serve_plan_builds(sockets.ends[1], kVersion91, [](const BuildRequest&) { return plan(); },
                                       milliseconds(200));
  CHECK(status == 0);
  CHECK(std::chrono::steady_clock::now() - started >= milliseconds(200));
  CHECK(std::chrono::steady_clock::now() - started < milliseconds(5000));
}

TEST_CASE("plan builder: a child that dies, hangs or answers garbage fails, and is reaped", "[plan_builders]") {
  std::atomic<bool> running{false};
  SECTION("dies at once") {
    PlanBuilder builder({"/bin/false"}, kVersion91, milliseconds(5000));
    CHECK_THROWS_WITH(builder.ready(running), Contains("ended as it started"));
    CHECK(builder.failed());
  }
  SECTION("never sends ready: timed out, killed") {
    pid_t pid = 0;
    {
      PlanBuilder builder(shell("exec sleep 60"), kVersion91, milliseconds(300));
      pid = builder.pid();
      CHECK_THROWS_WITH(builder.ready(running), Contains("did not start in time"));
      CHECK(builder.failed());
    }
    CHECK_FALSE(exists(pid));  // killed and reaped by the destructor, not left as a zombie
  }
  SECTION("a search that stops while it starts leaves it starting") {
    std::atomic<bool> stopped{true};
    PlanBuilder builder(shell("exec sleep 60"), kVersion91, milliseconds(5000));
    CHECK_FALSE(builder.ready(stopped));
    CHECK_FALSE(builder.failed());
  }
  SECTION("answers garbage") {
    PlanBuilder builder(shell("printf 'garbage garbage' >&3; exec sleep 60"), kVersion91, milliseconds(5000));
    CHECK_THROWS_WITH(builder.ready(running), Contains("not a frame"));
    CHECK(builder.failed());
  }
  SECTION("another cuDNN") {
    const std::string ready = frame_file("ready", encode_frame(FrameKind::ready, encode_version(90100)));
    PlanBuilder builder(shell("cat '" + ready + "' >&3; exec sleep 60"), kVersion91, milliseconds(5000));
    CHECK_THROWS_WITH(builder.ready(running), Contains("loaded cuDNN 90100 where this process has 91000"));
    std::filesystem::remove(ready);
  }
  SECTION("starts, then dies or hangs in a build") {
    const std::string ready = frame_file("ready", encode_frame(FrameKind::ready, encode_version(kVersion91)));
    const bool hangs = GENERATE(false, true);
    PlanBuilder builder(shell("cat '" + ready + "' >&3; " + (hangs ? "exec sleep 60" : "exit 0")), kVersion91,
                        milliseconds(5000));
    REQUIRE(builder.ready(running));
    CHECK_THROWS_WITH(builder.build(request(), milliseconds(300)),
                      Contains(hangs ? "no answer within the timeout" : "ended"));
    CHECK(builder.failed());
    std::filesystem::remove(ready);
  }
  SECTION("answers a request with an error: it could not build that plan, and still works") {
    const std::string answers =
        frame_file("answers", [] {
          std::vector<std::uint8_t> bytes = encode_frame(FrameKind::ready, encode_version(kVersion91));
          const std::vector<std::uint8_t> error = encode_frame(FrameKind::error, encode_text("NOT_SUPPORTED"));
          bytes.insert(bytes.end(), error.begin(), error.end());
          return bytes;
        }());
    PlanBuilder builder(shell("cat '" + answers + "' >&3; exec sleep 60"), kVersion91, milliseconds(5000));
    REQUIRE(builder.ready(running));
    CHECK_THROWS_WITH(builder.build(request(), milliseconds(5000)), "NOT_SUPPORTED");
    CHECK_FALSE(builder.failed());
    std::filesystem::remove(answers);
  }
}

TEST_CASE("plan builders: a device's builders are off after repeated failures", "[plan_builders]") {
  PlanBuilders::Settings settings;
  settings.command = {"/bin/false"};
  settings.bus_id = [](int) { return std::optional<std::string>("0000:00:00.0"); };
  PlanBuilders builders(settings);
  std::atomic<bool> running{false};
  for (int failure = 0; failure < PlanBuilders::kMaxFailures; ++failure) {
    std::unique_ptr<PlanBuilder> builder = builders.take(0);
    REQUIRE(builder);
    CHECK_THROWS(builder->ready(running));
    builders.give_back(0, std::move(builder));
  }
  CHECK(builders.disabled(0));
  CHECK_FALSE(builders.take(0));  // the search builds in-process
  CHECK_FALSE(builders.disabled(1));
  CHECK(builders.running() == 0);
  builders.set_executable("/bin/true");  // another tool: its failures are its own
  CHECK_FALSE(builders.disabled(0));

  PlanBuilders none(PlanBuilders::Settings{});
  CHECK_FALSE(none.take(0));  // no tool: in-process, silently
}

TEST_CASE("plan builders: an idle child is closed and reaped", "[plan_builders]") {
  const std::string ready = frame_file("ready", encode_frame(FrameKind::ready, encode_version(cudnnGetVersion())));
  PlanBuilders::Settings settings;
  settings.command = shell("cat '" + ready + "' >&3; exec sleep 60");
  settings.idle = milliseconds(300);
  settings.bus_id = [](int) { return std::optional<std::string>("0000:00:00.0"); };
  PlanBuilders builders(settings);
  std::atomic<bool> running{false};
  std::unique_ptr<PlanBuilder> builder = builders.take(0);
  REQUIRE(builder);
  REQUIRE(builder->ready(running));
  const pid_t pid = builder->pid();
  builders.give_back(0, std::move(builder));
  CHECK(builders.running() == 1);
  CHECK(exists(pid));
  SECTION("by the reaper") {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    // The reaper counts the child out under its lock, then kills and reaps it outside.
    while ((builders.running() > 0 || exists(pid)) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  SECTION("when builders are turned off") {
    builders.set_executable("");
    CHECK_FALSE(builders.take(0));
  }
  SECTION("given back after builders were turned off") {
    std::unique_ptr<PlanBuilder> in_use = builders.take(0);  // the idle one
    REQUIRE(in_use);
    builders.set_executable("");
    builders.give_back(0, std::move(in_use));
  }
  CHECK(builders.running() == 0);
  CHECK_FALSE(exists(pid));
  std::filesystem::remove(ready);
}

TEST_CASE("plan builders: below the memory floor no child starts, and running ones are closed, idle or taken, "
          "and stay off until the tool is set again", "[plan_builders][concurrency]") {
  constexpr std::size_t kGiB = std::size_t{1} << 30;
  CHECK(PlanBuilders::memory_floor(8 * kGiB) == 2 * kGiB);  // at least 2 GiB
  CHECK(PlanBuilders::memory_floor(140 * kGiB) == 14 * kGiB);  // 10% of the device
  const std::string ready =
      frame_file("yield-ready", encode_frame(FrameKind::ready, encode_version(cudnnGetVersion())));
  std::atomic<std::size_t> free_bytes{40 * kGiB};  // of 80 GiB: the floor is 8 GiB
  PlanBuilders::Settings settings;
  settings.command = shell("cat '" + ready + "' >&3; exec sleep 60");
  settings.bus_id = [](int) { return std::optional<std::string>("0000:00:00.0"); };
  settings.memory = [&](int) { return std::optional<DeviceMemory>(DeviceMemory{free_bytes.load(), 80 * kGiB}); };
  PlanBuilders builders(settings);
  std::atomic<bool> running{false};

  SECTION("no child starts where it would take free memory below the floor, and that is no failure") {
    free_bytes = 8 * kGiB + PlanBuilders::kChildMemory - 1;
    CHECK_FALSE(builders.take(0));
    CHECK_FALSE(builders.disabled(0));
    CHECK(builders.running() == 0);
    free_bytes = 8 * kGiB + PlanBuilders::kChildMemory;
    std::unique_ptr<PlanBuilder> builder = builders.take(0);
    REQUIRE(builder);
    builders.give_back(0, std::move(builder));
    CHECK(builders.running() == 1);
  }
  SECTION("below the floor, idle and taken children are closed, and have exited when yield_memory returns") {
    std::unique_ptr<PlanBuilder> idle = builders.take(0);
    std::unique_ptr<PlanBuilder> busy = builders.take(0);
    REQUIRE(idle);
    REQUIRE(busy);
    REQUIRE(idle->ready(running));
    REQUIRE(busy->ready(running));
    const pid_t idle_pid = idle->pid();
    const pid_t busy_pid = busy->pid();
    builders.give_back(0, std::move(idle));
    CHECK_FALSE(builders.yield_memory(0));  // above the floor
    free_bytes = 8 * kGiB - 1;
    CHECK_FALSE(builders.yield_memory(1));  // no builders on device 1
    CHECK_FALSE(builders.disabled(1));
    CHECK(builders.yield_memory(0));
    CHECK_FALSE(exists(idle_pid));  // killed and reaped
    siginfo_t info{};  // the taken one has exited, and is left for its holder to reap
    REQUIRE(waitid(P_PID, static_cast<id_t>(busy_pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0);
    CHECK(info.si_pid == busy_pid);
    CHECK_THROWS_AS(busy->build(request(), milliseconds(2000)), Error);  // its holder builds in-process
    CHECK(busy->failed());
    builders.give_back(0, std::move(busy));
    CHECK_FALSE(exists(busy_pid));
    CHECK(builders.running() == 0);
    CHECK(builders.disabled(0));
    CHECK_FALSE(builders.available(0));
    free_bytes = 40 * kGiB;
    CHECK_FALSE(builders.take(0));  // off, however much memory is free now
    CHECK_FALSE(builders.yield_memory(0));  // nothing left to close
    builders.set_executable("/bin/true");  // another tool: on again
    CHECK(builders.available(0));
    std::unique_ptr<PlanBuilder> again = builders.take(0);
    CHECK(again);
    builders.give_back(0, std::move(again));
  }
  std::filesystem::remove(ready);
}

namespace {

// A prefetch job for `request()` at heuristics' position `index`, on device 0.
PrefetchJob prefetch_job(std::int64_t index) {
  BuildRequest made = request();
  made.index = index;
  return {0, made};
}

// plan(), told apart by its last byte.
StoredPlan plan_numbered(std::uint8_t number) {
  StoredPlan made = plan();
  made.bytes.back() = number;
  return made;
}

// A builder command that sends ready, waits `delay` (sleep's argument), then answers with plans 1..`plans`
// (whatever was asked: the prefetcher's bookkeeping is under test, not the build) and idles.
struct FakeBuilder {
  std::string file;
  std::vector<std::string> command;
  FakeBuilder(const std::string& name, int plans, const std::string& delay = "0") {
    std::vector<std::uint8_t> bytes = encode_frame(FrameKind::ready, encode_version(cudnnGetVersion()));
    for (int number = 1; number <= plans; ++number) {
      const std::vector<std::uint8_t> frame =
          encode_frame(FrameKind::plan, encode_plan(plan_numbered(static_cast<std::uint8_t>(number))));
      bytes.insert(bytes.end(), frame.begin(), frame.end());
    }
    file = frame_file(name, bytes);
    command = shell("head -c " + std::to_string(kHeaderBytes + encode_version(0).size()) + " '" + file +
                    "' >&3; sleep " + delay + "; tail -c +" +
                    std::to_string(kHeaderBytes + encode_version(0).size() + 1) + " '" + file +
                    "' >&3; exec sleep 60");
  }
  ~FakeBuilder() { std::filesystem::remove(file); }
};

PlanBuilders::Settings builder_settings(std::vector<std::string> command) {
  PlanBuilders::Settings settings;
  settings.command = std::move(command);
  settings.build_timeout = milliseconds(5000);
  settings.bus_id = [](int) { return std::optional<std::string>("0000:00:00.0"); };
  return settings;
}

// Waits (polling: the prefetcher's threads signal no test hook) until `done` holds, or 10 s pass.
bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

}  // namespace

TEST_CASE("prefetched builds: a finished plan is taken once, and only by its own job",
          "[plan_builders][prefetch][concurrency]") {
  FakeBuilder fake("prefetch-once", 1);
  PlanBuilders builders(builder_settings(fake.command));
  PlanPrefetcher prefetcher({&builders, 512});
  REQUIRE(prefetcher.enqueue({prefetch_job(3)}, 1));
  CHECK_FALSE(prefetcher.enqueue({prefetch_job(3)}, 1));  // queued already: not twice
  REQUIRE(eventually([&] { return prefetcher.counts().finished == 1; }));
  CHECK(prefetcher.expected(prefetch_job(3)));
  CHECK_FALSE(prefetcher.expected(prefetch_job(4)));
  CHECK_FALSE(prefetcher.take(prefetch_job(4), milliseconds(0)));
  PrefetchJob other_device = prefetch_job(3);
  other_device.device = 1;
  CHECK_FALSE(prefetcher.take(other_device, milliseconds(0)));
  const std::shared_ptr<const StoredPlan> taken = prefetcher.take(prefetch_job(3), milliseconds(0));
  REQUIRE(taken);
  CHECK(taken->bytes == plan_numbered(1).bytes);
  CHECK(taken->config.engine_id == 12);
  CHECK_FALSE(prefetcher.take(prefetch_job(3), milliseconds(0)));  // once
  CHECK(prefetcher.plans_taken() == 1);
  CHECK(prefetcher.counts().finished == 0);
  // The thread gave its builder back when the queue was empty: the pool keeps it until idle.
  CHECK(eventually([&] { return builders.running() == 1 && builders.plans_built() == 1; }));
}

TEST_CASE("prefetched builds: a job in flight is waited for, a queued one is cancelled by take",
          "[plan_builders][prefetch][concurrency]") {
  FakeBuilder fake("prefetch-wait", 2, "1");  // the first answer takes a second
  PlanBuilders builders(builder_settings(fake.command));
  PlanPrefetcher prefetcher({&builders, 512});
  REQUIRE(prefetcher.enqueue({prefetch_job(1), prefetch_job(2)}, 1));  // one process: the second waits
  REQUIRE(eventually([&] { return prefetcher.counts().in_flight == 1; }));
  CHECK(prefetcher.counts().queued == 1);
  CHECK_FALSE(prefetcher.expected(prefetch_job(2)));  // queued only: the search builds it
  CHECK_FALSE(prefetcher.take(prefetch_job(2), milliseconds(5000)));  // cancelled at once, not waited for
  CHECK(prefetcher.counts().queued == 0);
  CHECK(prefetcher.expected(prefetch_job(1)));
  const auto asked = std::chrono::steady_clock::now();
  const std::shared_ptr<const StoredPlan> waited = prefetcher.take(prefetch_job(1), milliseconds(5000));
  REQUIRE(waited);
  CHECK(waited->bytes == plan_numbered(1).bytes);
  CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(4));
  // The cancelled job is never built (the child would answer it at once); the builder is given back.
  REQUIRE(eventually([&] { return builders.plans_built() >= 1; }));
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(prefetcher.counts().finished == 0);
  CHECK(builders.plans_built() == 1);
}

TEST_CASE("prefetched builds: an in-flight job waited for past the timeout gives nothing",
          "[plan_builders][prefetch][concurrency]") {
  FakeBuilder fake("prefetch-slow", 1, "2");
  PlanBuilders builders(builder_settings(fake.command));
  PlanPrefetcher prefetcher({&builders, 512});
  REQUIRE(prefetcher.enqueue({prefetch_job(1)}, 1));
  REQUIRE(eventually([&] { return prefetcher.counts().in_flight == 1; }));
  CHECK_FALSE(prefetcher.take(prefetch_job(1), milliseconds(100)));
  // It stays for a later take, or the bound.
  CHECK(prefetcher.take(prefetch_job(1), milliseconds(5000)));
}

TEST_CASE("prefetched builds: the bound drops the oldest finished jobs", "[plan_builders][prefetch][concurrency]") {
  FakeBuilder fake("prefetch-bound", 8);
  PlanBuilders builders(builder_settings(fake.command));
  PlanPrefetcher prefetcher({&builders, 2});
  for (std::int64_t index = 1; index <= 3; ++index) {  // one at a time: the queue is bounded too
    REQUIRE(prefetcher.enqueue({prefetch_job(index)}, 1));
    REQUIRE(eventually([&] {
      const PlanPrefetcher::Counts counts = prefetcher.counts();
      return counts.queued == 0 && counts.in_flight == 0;
    }));
  }
  CHECK(prefetcher.counts().finished == 2);
  CHECK_FALSE(prefetcher.take(prefetch_job(1), milliseconds(0)));  // the oldest, dropped
  const std::shared_ptr<const StoredPlan> second = prefetcher.take(prefetch_job(2), milliseconds(0));
  const std::shared_ptr<const StoredPlan> third = prefetcher.take(prefetch_job(3), milliseconds(0));
  REQUIRE(second);
  REQUIRE(third);
  CHECK(second->bytes == plan_numbered(2).bytes);
  CHECK(third->bytes == plan_numbered(3).bytes);
  // And a queue as long as the bound takes no more (one job at most has left it for the thread meanwhile).
  CHECK(prefetcher.enqueue({prefetch_job(4), prefetch_job(5), prefetch_job(6), prefetch_job(7)}, 1));
  CHECK(prefetcher.counts().queued <= 2);
}

TEST_CASE("prefetched builds: a failed build gives nothing, and a failed builder is counted",
          "[plan_builders][prefetch][concurrency]") {
  SECTION("no builder can start: the job fails once the device's builders are off") {
    PlanBuilders builders(builder_settings({"/bin/false"}));
    PlanPrefetcher prefetcher({&builders, 512});
    REQUIRE(prefetcher.enqueue({prefetch_job(1)}, 1));
    REQUIRE(eventually([&] { return prefetcher.counts().finished == 1; }));
    CHECK_FALSE(prefetcher.expected(prefetch_job(1)));  // the search builds it
    CHECK_FALSE(prefetcher.take(prefetch_job(1), milliseconds(0)));
    CHECK(builders.running() == 0);
    CHECK(builders.disabled(0));  // each start's failure counted as a search's is, until the builders are off
    CHECK_FALSE(prefetcher.enqueue({prefetch_job(20)}, 1));  // builders are off now: nothing queued
  }
  SECTION("the builder cannot build that plan, and builds the next") {
    std::vector<std::uint8_t> bytes = encode_frame(FrameKind::ready, encode_version(cudnnGetVersion()));
    for (const std::vector<std::uint8_t>& frame : {encode_frame(FrameKind::error, encode_text("NOT_SUPPORTED")),
                                                   encode_frame(FrameKind::plan, encode_plan(plan_numbered(2)))}) {
      bytes.insert(bytes.end(), frame.begin(), frame.end());
    }
    const std::string answers = frame_file("prefetch-error", bytes);
    PlanBuilders builders(builder_settings(shell("cat '" + answers + "' >&3; exec sleep 60")));
    PlanPrefetcher prefetcher({&builders, 512});
    REQUIRE(prefetcher.enqueue({prefetch_job(1), prefetch_job(2)}, 1));
    REQUIRE(eventually([&] { return prefetcher.counts().finished == 2; }));
    CHECK_FALSE(prefetcher.take(prefetch_job(1), milliseconds(0)));
    const std::shared_ptr<const StoredPlan> built = prefetcher.take(prefetch_job(2), milliseconds(0));
    REQUIRE(built);
    CHECK(built->bytes == plan_numbered(2).bytes);
    CHECK_FALSE(builders.disabled(0));
    std::filesystem::remove(answers);
  }
}

TEST_CASE("prefetched builds: nothing without builders, and a prefetcher destroyed mid-build ends cleanly",
          "[plan_builders][prefetch][concurrency]") {
  SECTION("no tool") {
    PlanBuilders none(PlanBuilders::Settings{});
    PlanPrefetcher prefetcher({&none, 512});
    CHECK_FALSE(prefetcher.enqueue({prefetch_job(1)}, 4));
    CHECK(prefetcher.counts().queued == 0);
    CHECK_FALSE(prefetcher.take(prefetch_job(1), milliseconds(0)));
  }
  SECTION("no processes") {
    FakeBuilder fake("prefetch-none", 1);
    PlanBuilders builders(builder_settings(fake.command));
    PlanPrefetcher prefetcher({&builders, 512});
    CHECK_FALSE(prefetcher.enqueue({prefetch_job(1)}, 0));
    CHECK(prefetcher.counts().queued == 0);
    CHECK(builders.running() == 0);
  }
  SECTION("destroyed while building and with jobs queued") {
    FakeBuilder fake("prefetch-destroyed", 3, "1");
    PlanBuilders builders(builder_settings(fake.command));
    {
      PlanPrefetcher prefetcher({&builders, 512});
      REQUIRE(prefetcher.enqueue({prefetch_job(1), prefetch_job(2), prefetch_job(3)}, 1));
      REQUIRE(eventually([&] { return prefetcher.counts().in_flight == 1; }));
    }  // joins its thread, which finishes its build (or stops its builder's start) and builds no more
    CHECK(builders.plans_built() == 1);  // the child would answer the queued ones at once if asked
  }
}

#ifdef CUDNN_CACHE_TOOL
namespace {

// The tool's exit status and what it printed, for `arguments` (shell words).
std::pair<int, std::string> run_tool(const std::string& arguments) {
  const std::string command = std::string("'") + CUDNN_CACHE_TOOL + "' " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  std::string output;
  char buffer[512];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace

TEST_CASE("cudnn_cache_tool build-plans: refuses bad arguments, and without a GPU fails clearly",
          "[plan_builders][tool]") {
  auto [status, output] = run_tool("build-plans");
  CHECK(status == 2);
  CHECK_THAT(output, Contains("build-plans: the following arguments are required: --device-pci-bus-id"));
  std::tie(status, output) = run_tool("build-plans --device-pci-bus-id 0000:00:00.0 --extra");
  CHECK(status == 2);
  std::tie(status, output) = run_tool("build-plans --device-pci-bus-id 0000:00:00.0 3</dev/null");
  CHECK(status == 2);
  CHECK_THAT(output, Contains("fd 3, which is not a socket"));

  // As a search starts it, on a socket: without that GPU (or any) it says so on stderr and never gets ready.
  const std::string log =
      (std::filesystem::temp_directory_path() / ("build-plans-" + std::to_string(getpid()))).string();
  std::atomic<bool> running{false};
  PlanBuilder builder({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>'" + log + "'", CUDNN_CACHE_TOOL, "build-plans",
                       "--device-pci-bus-id", "0000:ff:1f.0"},
                      cudnnGetVersion(), milliseconds(60'000));
  CHECK_THROWS_WITH(builder.ready(running), Contains("ended as it started"));
  std::ifstream file(log);
  const std::string said((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CHECK_THAT(said, Contains("no CUDA device has PCI bus id '0000:ff:1f.0'"));
  std::filesystem::remove(log);
}
#endif
