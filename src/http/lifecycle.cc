#include "http/lifecycle.h"

#include <algorithm>

namespace metrale::http {

std::shared_ptr<void> Lifecycle::admit() {
  std::lock_guard lock(mu_);
  if (draining_ || stopping_) return nullptr;
  ++in_flight_;
  // The token owns nothing; its deleter is the departure.
  return std::shared_ptr<void>(this, [](void* self) { static_cast<Lifecycle*>(self)->leave(); });
}

void Lifecycle::leave() {
  {
    std::lock_guard lock(mu_);
    --in_flight_;
  }
  cv_.notify_all();
}

bool Lifecycle::draining() const {
  std::lock_guard lock(mu_);
  return draining_ || stopping_;
}

bool Lifecycle::ending() const {
  std::lock_guard lock(mu_);
  return ending_;
}

bool Lifecycle::stopping() const {
  std::lock_guard lock(mu_);
  return stopping_;
}

int64_t Lifecycle::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

int64_t Lifecycle::retry_after_seconds() const {
  std::lock_guard lock(mu_);
  if (!draining_ || ending_ || stopping_) return 1;
  const auto left = std::chrono::ceil<std::chrono::seconds>(deadline_ - Clock::now()).count();
  return std::max<int64_t>(left, 1);
}

int64_t Lifecycle::drain(std::chrono::milliseconds timeout, std::chrono::milliseconds grace) {
  std::unique_lock lock(mu_);
  if (draining_ || stopping_) return 0;
  draining_ = true;
  deadline_ = Clock::now() + timeout;
  const auto done = [&] { return in_flight_ == 0 || stopping_; };
  if (cv_.wait_until(lock, deadline_, done)) return 0;
  const int64_t left = in_flight_;
  ending_ = true;
  cv_.wait_for(lock, grace, done);
  return left;
}

void Lifecycle::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

}  // namespace metrale::http
