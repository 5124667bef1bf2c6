// One search per key (Note [One search per key]): InFlight runs a key's work once however many threads ask for
// it at once, passes its outcome to those that waited, and forgets the key when the work ends.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cache_fixtures.h"
#include "cudnn_cache/key.h"
#include "in_flight.h"

using namespace cudnn_cache;

namespace {

// Starts `threads` threads together on `body(t)`.
template <typename Body>
void on_threads(int threads, Body body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      ++ready;
      while (ready.load() < threads) std::this_thread::yield();
      body(t);
    });
  }
  for (std::thread& thread : running) thread.join();
}

// Work that takes long enough for every thread to arrive while it runs.
void slow_work(std::atomic<int>& runs) {
  ++runs;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

TEST_CASE("threads asking for one key's work at once run it once, and the others wait for its end",
          "[in_flight][concurrency]") {
  InFlight in_flight;
  int cache = 0;
  const ConvolutionKey key = testing::conv_key(Direction::forward, 4);
  std::atomic<int> runs{0}, ran{0}, returned_after_the_work{0};
  std::atomic<bool> done{false};
  on_threads(8, [&](int) {
    if (in_flight.run_once(&cache, key, [&] {
          slow_work(runs);
          done = true;
        })) {
      ++ran;
    }
    if (done.load()) ++returned_after_the_work;  // a waiter returns only once the work has ended
  });
  CHECK(runs == 1);
  CHECK(ran == 1);
  CHECK(returned_after_the_work == 8);
}

TEST_CASE("work for other keys, or for the same key of another cache, runs at the same time", "[in_flight]") {
  InFlight in_flight;
  int caches[2] = {0, 0};
  std::atomic<int> runs{0}, ran{0};
  // Four slots, two threads each: each slot's work runs once, all four at once (each waits for the others to
  // start, which would deadlock if one slot's work blocked another's).
  std::atomic<int> started{0};
  on_threads(8, [&](int t) {
    const ConvolutionKey key = testing::conv_key(Direction::forward, 1 + t % 2);
    const bool ran_it = in_flight.run_once(&caches[(t / 2) % 2], key, [&] {
      ++runs;
      ++started;
      while (started.load() < 4) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    });
    if (ran_it) ++ran;
  });
  CHECK(runs == 4);
  CHECK(ran == 4);
}

TEST_CASE("the work's error reaches every thread that waited, and the next call runs the work again",
          "[in_flight]") {
  InFlight in_flight;
  int cache = 0;
  const ConvolutionKey key = testing::conv_key(Direction::forward, 2);
  std::atomic<int> runs{0}, errors{0};
  on_threads(6, [&](int) {
    try {
      in_flight.run_once(&cache, key, [&] {
        slow_work(runs);
        throw std::runtime_error("cuDNN found no engine config that runs");
      });
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()) == "cuDNN found no engine config that runs") ++errors;
    }
  });
  CHECK(runs == 1);
  CHECK(errors == 6);
  CHECK(in_flight.run_once(&cache, key, [&] { ++runs; }));  // forgotten after it failed
  CHECK(runs == 2);
}

TEST_CASE("a key whose work ended runs it again on its next call", "[in_flight]") {
  InFlight in_flight;
  int cache = 0;
  const ConvolutionKey key = testing::conv_key(Direction::forward, 3);
  int runs = 0;
  CHECK(in_flight.run_once(&cache, key, [&] { ++runs; }));
  CHECK(in_flight.run_once(&cache, key, [&] { ++runs; }));
  CHECK(runs == 2);
}
