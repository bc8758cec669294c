#pragma once
// The server's lifecycle, without any HTTP: serving -> draining -> ending -> stopped, and the
// generation requests in flight, which a drain waits for.
//
//   serving   requests are admitted
//   draining  admit() refuses (the handler answers 503 with Retry-After, /health 503), while
//             the requests already admitted run on; drain() waits for them up to its timeout
//   ending    the timeout passed with requests still running: each ends itself cleanly at its
//             next check (ending() is true), and drain() waits up to its grace for them
//   stopped   stop(): the hard stop (also what drain() ends with, by its caller)
//
// Thread-safe; drain() blocks its caller, stop() from another thread cuts it short.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace metrale::http {

class Lifecycle {
 public:
  using Clock = std::chrono::steady_clock;

  // A request's admission: hold the token until its response is written (a stream: until its
  // last byte). nullptr once draining or stopped (the request is refused).
  std::shared_ptr<void> admit();

  bool draining() const;  // draining, ending or stopped: new requests are refused
  bool ending() const;    // running requests must end now
  bool stopping() const;  // stop() was called
  int64_t in_flight() const;
  // What a refused request's Retry-After says: the seconds until the drain's deadline (when this
  // replica is gone, or back), at least 1.
  int64_t retry_after_seconds() const;

  // Refuses new requests, waits up to `timeout` for those in flight, then (if any are left)
  // sets ending() and waits up to `grace` more for them to finish. Returns how many were still
  // in flight when ending() was set (0: all finished in time). Once per lifecycle; returns at
  // once after stop().
  int64_t drain(std::chrono::milliseconds timeout, std::chrono::milliseconds grace);
  // The hard stop: refuses new requests and wakes drain().
  void stop();

 private:
  void leave();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t in_flight_ = 0;       // guarded by mu_
  bool draining_ = false;       // guarded by mu_
  bool ending_ = false;         // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  Clock::time_point deadline_;  // guarded by mu_; the drain's, once draining
};

}  // namespace metrale::http
