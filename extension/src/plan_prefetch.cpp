// Prefetched builds: Note [Prefetched builds] in plan_prefetch.h.

#include "plan_prefetch.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

namespace cudnn_cache {

PlanPrefetcher& PlanPrefetcher::instance() {
  static PlanPrefetcher* prefetcher = new PlanPrefetcher(Settings{});  // on PlanBuilders::instance()
  return *prefetcher;
}

PlanPrefetcher::PlanPrefetcher(Settings settings) : settings_(settings) {
  if (!settings_.builders) settings_.builders = &PlanBuilders::instance();
}

PlanPrefetcher::~PlanPrefetcher() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    stopped_.store(true);  // a builder still starting is not waited for
    queues_.clear();  // threads find nothing more to build
    threads.swap(threads_);
  }
  finished_changed_.notify_all();
  for (std::thread& thread : threads) thread.join();
}

PlanPrefetcher::Id PlanPrefetcher::id_of(const PrefetchJob& job) {
  return {job.device, job.request.key, job.request.deterministic, job.request.index, job.request.name};
}

bool PlanPrefetcher::enqueue(const std::vector<PrefetchJob>& jobs, int processes) {
  if (processes <= 0 || jobs.empty()) return false;
  join_ended();
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  bool queued = false;
  for (const PrefetchJob& job : jobs) {
    if (queued_ >= settings_.capacity || !settings_.builders->available(job.device)) continue;
    const Id id = id_of(job);
    if (!jobs_.emplace(id, Job{}).second) continue;  // queued, in flight or finished already
    queues_[job.device].push_back(id);
    ++queued_;
    queued = true;
    int& threads = threads_of_[job.device];
    if (threads >= processes) continue;
    try {
      threads_.emplace_back([this, device = job.device] { work(device); });
      ++threads;
    } catch (const std::exception&) {  // no thread: the device's running threads, if any, build it, else searches
    }
  }
  return queued;
}

void PlanPrefetcher::work(int device) {
  PlanBuilders& builders = *settings_.builders;
  std::unique_ptr<PlanBuilder> builder;
  for (;;) {
    // The builder is ready before the thread takes a job: a search waits for a compilation under way, never for
    // a builder's start (a queued job is the search's to build meanwhile).
    if (!builder) builder = builders.take(device);
    bool ready = false;
    try {
      ready = builder && builder->ready(stopped_);
    } catch (const std::exception&) {  // it did not start: closed and counted, and another taken
      builders.give_back(device, std::move(builder));
      continue;  // until the device's builders are off (PlanBuilders::kMaxFailures)
    }
    std::unique_lock lock(mutex_);
    std::optional<Id> id;
    if (ready && !stopping_) id = next_queued(device);
    if (!id) {
      // No builder for the device: its queued jobs fail, unless another thread builds them.
      if (!builder && threads_of_[device] == 1) fail_queued(device);
      --threads_of_[device];
      if (!stopping_) ended_.push_back(std::this_thread::get_id());  // the destructor joins it otherwise
      lock.unlock();
      builders.give_back(device, std::move(builder));  // idle: the pool's reaper closes it
      return;
    }
    lock.unlock();
    std::shared_ptr<const StoredPlan> plan;
    try {
      const auto& [job_device, key, deterministic, index, name] = *id;
      plan = std::make_shared<const StoredPlan>(
          builder->build({key, deterministic, index, name}, builders.settings().build_timeout));
    } catch (const std::exception&) {  // it failed, or could not build this plan: the job failed
    }
    if (builder->failed()) builders.give_back(device, std::move(builder));  // closed and counted
    lock.lock();
    --in_flight_;
    finish(*id, std::move(plan));
  }
}

std::optional<PlanPrefetcher::Id> PlanPrefetcher::next_queued(int device) {
  std::deque<Id>& queue = queues_[device];
  while (!queue.empty()) {
    const Id id = queue.front();
    queue.pop_front();
    const auto found = jobs_.find(id);
    if (found == jobs_.end() || found->second.state != State::queued) continue;  // taken by a search meanwhile
    found->second.state = State::in_flight;
    --queued_;
    ++in_flight_;
    return id;
  }
  return std::nullopt;
}

void PlanPrefetcher::fail_queued(int device) {
  std::deque<Id> queue;
  queue.swap(queues_[device]);
  for (const Id& id : queue) {
    const auto found = jobs_.find(id);
    if (found == jobs_.end() || found->second.state != State::queued) continue;
    --queued_;
    finish(id, nullptr);
  }
}

void PlanPrefetcher::finish(const Id& id, std::shared_ptr<const StoredPlan> plan) {
  const auto found = jobs_.find(id);
  if (found == jobs_.end()) return;
  Job& job = found->second;
  job.state = plan ? State::done : State::failed;
  job.plan = std::move(plan);
  job.finished = finished_.insert(finished_.end(), id);
  while (finished_.size() > settings_.capacity) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
  finished_changed_.notify_all();
}

void PlanPrefetcher::join_ended() {
  std::vector<std::thread> ended;
  {
    std::lock_guard lock(mutex_);
    for (const std::thread::id id : ended_) {
      const auto thread = std::find_if(threads_.begin(), threads_.end(),
                                       [&](const std::thread& t) { return t.get_id() == id; });
      if (thread == threads_.end()) continue;
      ended.push_back(std::move(*thread));
      threads_.erase(thread);
    }
    ended_.clear();
  }
  for (std::thread& thread : ended) thread.join();  // each has returned, or is about to
}

std::shared_ptr<const StoredPlan> PlanPrefetcher::take(const PrefetchJob& job, std::chrono::milliseconds timeout) {
  const Id id = id_of(job);
  std::unique_lock lock(mutex_);
  auto found = jobs_.find(id);
  if (found == jobs_.end()) return nullptr;
  if (found->second.state == State::queued) {  // cancelled: the caller builds it now rather than wait
    jobs_.erase(found);
    --queued_;
    return nullptr;
  }
  if (found->second.state == State::in_flight) {
    // Never the same compilation twice: wait for the one under way.
    finished_changed_.wait_for(lock, timeout, [&] {
      found = jobs_.find(id);
      return stopping_ || found == jobs_.end() || found->second.state != State::in_flight;
    });
    if (found == jobs_.end() || found->second.state == State::in_flight) return nullptr;
  }
  std::shared_ptr<const StoredPlan> plan = std::move(found->second.plan);
  finished_.erase(found->second.finished);
  jobs_.erase(found);
  if (plan) ++plans_taken_;
  return plan;
}

bool PlanPrefetcher::expected(const PrefetchJob& job) const {
  std::lock_guard lock(mutex_);
  const auto found = jobs_.find(id_of(job));
  return found != jobs_.end() && (found->second.state == State::in_flight || found->second.state == State::done);
}

std::uint64_t PlanPrefetcher::plans_taken() const {
  std::lock_guard lock(mutex_);
  return plans_taken_;
}

PlanPrefetcher::Counts PlanPrefetcher::counts() const {
  std::lock_guard lock(mutex_);
  return {queued_, in_flight_, finished_.size()};
}

}  // namespace cudnn_cache
