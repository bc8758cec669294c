#pragma once
// What bounds a connection before its request reaches a handler: cpp-httplib 0.11 has only
// per-recv / per-send timeouts and an unbounded queue of accepted connections, so a client that
// dribbles its request head or body one byte per (read timeout - 1) seconds would hold a
// connection thread forever, and a flood of connections would queue without end.
//
// The guard is the server's TaskQueue (httplib::Server::new_task_queue): it sees every accepted
// connection, finds its socket, and
//   - refuses (a 503 with Retry-After, then closed) a connection past max_connections open ones
//     (served + waiting for a thread);
//   - gives each request a whole-head deadline (head_timeout, from the connection's start or its
//     previous response, so it includes the keep-alive wait) and a whole-body deadline
//     (body_timeout, from the end of the head to the handler's body_done()); a watchdog thread
//     shuts down the socket of a request past its deadline, which ends httplib's read at once.
// Past the body, a request belongs to its handler (the request timeout, the write timeout and
// the client-gone poll bound it).
//
// The connection thread tells the guard where its request is: head_done() (pre-routing),
// body_done() (the handler read its body), response_done() (httplib's logger, after the reply).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

namespace httplib {
class TaskQueue;
}

namespace metrale::http {

struct ConnectionLimits {
  int threads = 128;          // connections served at once
  int max_connections = 512;  // open connections (served + waiting for a thread)
  std::chrono::milliseconds head_timeout{15000};
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds watch_interval{100};  // how often deadlines are checked
};

struct ConnectionCounts {
  int64_t open = 0;       // accepted and not yet closed
  int64_t rejected = 0;   // refused past max_connections
  int64_t timed_out = 0;  // shut down past a head or body deadline
};

class ConnectionGuard {
 public:
  explicit ConnectionGuard(ConnectionLimits limits);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // The port the server listens on (its accepted sockets are found by it); before listen.
  void set_port(int port);
  // A new task queue for httplib::Server::new_task_queue (one per listen(); the guard outlives
  // it).
  httplib::TaskQueue* make_task_queue();

  // On a connection thread, about its current request.
  static void head_done();
  static void body_done();
  static void response_done();

  ConnectionCounts counts() const;

  struct State;  // shared with the task queues (connection_guard.cc)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace metrale::http
