#include "http/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <httplib.h>

namespace metrale::http {
namespace {

enum class Phase : int { kHead, kBody, kHandler };

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One accepted connection.
struct Slot {
  int fd = -1;    // -1: its socket was not found (then only httplib's timeouts bound it)
  ino_t ino = 0;  // the socket's inode: tells this socket from a later one on a reused fd
  std::atomic<int> phase{static_cast<int>(Phase::kHead)};
  std::atomic<int64_t> since_ns{now_ns()};
  bool cut = false;  // shut down by the watchdog (guarded by State::mu)
};

thread_local Slot* current = nullptr;  // the connection this thread serves

void enter(Phase p) {
  if (current == nullptr) return;  // a thread outside the guard (tests driving handlers)
  current->since_ns = now_ns();
  current->phase = static_cast<int>(p);
}

int local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

bool connected(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
}

// What a refused connection reads before the server closes it.
std::string refusal() {
  const std::string body =
      R"({"error":{"message":"too many open connections; retry later","type":"server_error",)"
      R"("param":null,"code":"too_many_connections"}})";
  return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

struct ConnectionGuard::State {
  explicit State(ConnectionLimits l) : limits(l) {}

  const ConnectionLimits limits;
  std::atomic<int> port{-1};
  std::mutex mu;
  std::map<Slot*, std::shared_ptr<Slot>> slots;  // open connections (guarded by mu)
  int64_t rejected = 0, timed_out = 0;           // guarded by mu
  bool stopping = false;                         // guarded by mu
  std::condition_variable wake;
  std::thread watchdog;

  // The socket httplib just accepted: the connected socket on our port that no open
  // connection owns (the listener thread accepts and enqueues in turn, so there is one).
  // Caller holds mu.
  void find_socket(Slot& slot) const {
    std::set<ino_t> owned;
    for (const auto& [p, s] : slots) owned.insert(s->ino);
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return;
    const int self = dirfd(dir);
    while (const dirent* e = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd == self) continue;
      struct stat st {};
      if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode) ||
          owned.count(st.st_ino) != 0) {
        continue;
      }
      if (local_port(static_cast<int>(fd)) == port && connected(static_cast<int>(fd))) {
        slot.fd = static_cast<int>(fd);
        slot.ino = st.st_ino;
        break;
      }
    }
    closedir(dir);
  }

  // Registers a new connection; nullptr when it was refused (its socket answered and shut
  // down, so httplib's handling of it ends at once).
  std::shared_ptr<Slot> accept() {
    auto slot = std::make_shared<Slot>();
    std::lock_guard lock(mu);
    find_socket(*slot);
    if (static_cast<int64_t>(slots.size()) >= limits.max_connections && slot->fd >= 0) {
      const std::string reply = refusal();
      char drain[4096];
      while (recv(slot->fd, drain, sizeof drain, MSG_DONTWAIT) > 0) {
      }
      [[maybe_unused]] const ssize_t sent =
          send(slot->fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      shutdown(slot->fd, SHUT_RDWR);
      ++rejected;
      return nullptr;
    }
    slots.emplace(slot.get(), slot);
    return slot;
  }

  void release(Slot* slot) {
    std::lock_guard lock(mu);
    slots.erase(slot);
  }

  void watch() {
    std::unique_lock lock(mu);
    while (!stopping) {
      wake.wait_for(lock, limits.watch_interval);
      const int64_t now = now_ns();
      for (auto& [p, s] : slots) {
        const auto phase = static_cast<Phase>(s->phase.load());
        if (s->cut || s->fd < 0 || phase == Phase::kHandler) continue;
        const auto limit = phase == Phase::kHead ? limits.head_timeout : limits.body_timeout;
        if (now - s->since_ns.load() < std::chrono::nanoseconds(limit).count()) continue;
        // The fd is still this connection's while its inode matches: httplib closes it on the
        // connection thread, and a new socket on the same number gets another inode. (A close
        // and a reuse between this check and the shutdown below is the one window left; the
        // listener's accept and enqueue of the reused number waits on mu after it.)
        struct stat st {};
        if (fstat(s->fd, &st) != 0 || st.st_ino != s->ino) continue;
        shutdown(s->fd, SHUT_RDWR);
        s->cut = true;
        ++timed_out;
      }
    }
  }
};

namespace {

// httplib's thread pool behind the guard's accounting.
class GuardedQueue : public httplib::TaskQueue {
 public:
  explicit GuardedQueue(std::shared_ptr<ConnectionGuard::State> state)
      : state_(std::move(state)), pool_(static_cast<size_t>(state_->limits.threads)) {}

  void enqueue(std::function<void()> fn) override {
    std::shared_ptr<Slot> slot = state_->accept();
    if (slot == nullptr) {
      fn();  // the refused socket: httplib reads its end of input and closes it
      return;
    }
    pool_.enqueue([state = state_, slot, fn = std::move(fn)] {
      current = slot.get();
      enter(Phase::kHead);
      fn();
      current = nullptr;
      state->release(slot.get());
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  std::shared_ptr<ConnectionGuard::State> state_;
  httplib::ThreadPool pool_;
};

}  // namespace

ConnectionGuard::ConnectionGuard(ConnectionLimits limits)
    : state_(std::make_shared<State>(limits)) {
  state_->watchdog = std::thread([s = state_.get()] { s->watch(); });
}

ConnectionGuard::~ConnectionGuard() {
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  state_->watchdog.join();
}

void ConnectionGuard::set_port(int port) { state_->port = port; }

httplib::TaskQueue* ConnectionGuard::make_task_queue() { return new GuardedQueue(state_); }

void ConnectionGuard::head_done() { enter(Phase::kBody); }
void ConnectionGuard::body_done() { enter(Phase::kHandler); }
void ConnectionGuard::response_done() { enter(Phase::kHead); }

ConnectionCounts ConnectionGuard::counts() const {
  std::lock_guard lock(state_->mu);
  return {.open = static_cast<int64_t>(state_->slots.size()),
          .rejected = state_->rejected,
          .timed_out = state_->timed_out};
}

}  // namespace metrale::http
