#include "kvevents/kv_event_publisher.h"

#include <zmq.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <type_traits>

#include "core/error.h"
#include "kvevents/msgpack_writer.h"

namespace metrale::kvevents {
namespace {

// One event. `map`: msgspec's default Struct encoding (a map, the tag under "type", fields in
// declaration order); else array_like (the tag first, then the fields by position).
void write_event(MsgpackWriter& w, const KvCacheEvent& event, bool map) {
  auto key = [&](std::string_view name) {
    if (map) w.str(name);
  };
  auto hashes = [&](const std::vector<uint64_t>& h) {
    w.array(h.size());
    for (uint64_t x : h) w.unsigned_integer(x);
  };
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, KvBlockStored>) {
          map ? w.map(8) : w.array(8);
          key("type");
          w.str("BlockStored");
          key("block_hashes");
          hashes(e.block_hashes);
          key("parent_block_hash");
          if (e.parent_block_hash) {
            w.unsigned_integer(*e.parent_block_hash);
          } else {
            w.nil();
          }
          key("token_ids");
          w.array(e.token_ids.size());
          for (int32_t t : e.token_ids) w.integer(t);
          key("block_size");
          w.integer(e.block_size);
          key("lora_id");
          if (e.lora_id) {
            w.integer(*e.lora_id);
          } else {
            w.nil();
          }
          // medium: none of vLLM's tier names ("GPU", "CPU_PINNED", ...) is claimed.
          key("medium");
          w.nil();
          key("lora_name");
          if (e.lora_name.empty()) {
            w.nil();
          } else {
            w.str(e.lora_name);
          }
        } else if constexpr (std::is_same_v<T, KvBlockRemoved>) {
          map ? w.map(3) : w.array(3);
          key("type");
          w.str("BlockRemoved");
          key("block_hashes");
          hashes(e.block_hashes);
          key("medium");
          w.nil();
        } else {
          map ? w.map(1) : w.array(1);
          key("type");
          w.str("AllBlocksCleared");
        }
      },
      event);
}

std::string zmq_error() { return zmq_strerror(zmq_errno()); }

}  // namespace

std::string encode_kv_event_batch(double unix_seconds, std::span<const KvCacheEvent> events,
                                  KvEventEncoding encoding) {
  const bool map = encoding == KvEventEncoding::kMap;
  const bool map_events = encoding != KvEventEncoding::kArray;
  MsgpackWriter w;
  if (map) {
    // vLLM's publisher stamps its data-parallel rank (0) on every batch.
    w.map(3);
    w.str("ts");
    w.float64(unix_seconds);
    w.str("events");
  } else {
    w.array(map_events ? 3 : 2);
    w.float64(unix_seconds);
  }
  w.array(events.size());
  for (const KvCacheEvent& e : events) write_event(w, e, map_events);
  if (map) w.str("data_parallel_rank");
  if (map_events) w.integer(0);
  return w.take();
}

KvEventEncoding kv_event_encoding_from_name(std::string_view name) {
  if (name == "map") return KvEventEncoding::kMap;
  if (name == "array") return KvEventEncoding::kArray;
  if (name == "array-batch") return KvEventEncoding::kArrayBatchOfMaps;
  throw make_error("unknown KV-event encoding '", name, "' (expected map, array or array-batch)");
}

namespace {

// Binds `socket` at `endpoint`; the endpoint as bound (a wildcard port resolved), or an Error
// naming the flag and the endpoint.
std::string bind_or_throw(void* socket, const std::string& endpoint, const char* flag) {
  if (zmq_bind(socket, endpoint.c_str()) != 0) {
    const std::string why = zmq_error();
    throw make_error(flag, " ", endpoint, ": cannot bind (", why,
                     "); expected a ZMQ endpoint such as tcp://*:5557 or ipc:///tmp/kv.sock");
  }
  std::array<char, 256> last{};
  size_t len = last.size();
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, last.data(), &len) == 0) return last.data();
  return endpoint;
}

std::array<char, 8> big_endian(uint64_t x) {
  std::array<char, 8> out{};
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>(x >> (56 - 8 * i));
  return out;
}

// One replay request's frames as a ROUTER reads them, all of its parts drained (at most the
// first 4 kept: more already makes it malformed).
std::vector<std::string> receive_request(void* router) {
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&part);
      return frames;
    }
    if (frames.size() < 4) {
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
    }
    const bool more = zmq_msg_more(&part) != 0;
    zmq_msg_close(&part);
    if (!more) return frames;
  }
}

}  // namespace

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options) : options_(std::move(options)) {
  METRALE_CHECK(!options_.endpoint.empty(), "--kv-events-endpoint: empty");
  METRALE_CHECK(options_.max_queue >= 1, "kv events: max_queue must be >= 1");
  METRALE_CHECK(options_.replay_endpoint.empty() || options_.buffer_steps >= 1,
                "--kv-events-buffer-steps: expected at least 1, found ", options_.buffer_steps);
  context_ = zmq_ctx_new();
  METRALE_CHECK(context_ != nullptr, "kv events: cannot make a ZMQ context: ", zmq_error());
  try {
    socket_ = zmq_socket(context_, ZMQ_PUB);
    METRALE_CHECK(socket_ != nullptr, "kv events: cannot make a ZMQ PUB socket: ", zmq_error());
    // Closing sends what is queued for up to a second, then drops it.
    const int linger = 1000;
    zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger);
    const int hwm = static_cast<int>(std::min<size_t>(options_.max_queue, 1 << 30));
    zmq_setsockopt(socket_, ZMQ_SNDHWM, &hwm, sizeof hwm);
    bound_ = bind_or_throw(socket_, options_.endpoint, "--kv-events-endpoint");
    if (!options_.replay_endpoint.empty()) {
      replay_ = zmq_socket(context_, ZMQ_ROUTER);
      METRALE_CHECK(replay_ != nullptr,
                    "kv events: cannot make a ZMQ ROUTER socket: ", zmq_error());
      // A reply is sent at its reader's pace: a full pipe says EAGAIN (rather than dropping
      // the message), a peer gone EHOSTUNREACH. The high-water mark (ZMQ's default) bounds
      // the messages queued per peer.
      const int mandatory = 1, replay_hwm = 1000;
      zmq_setsockopt(replay_, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
      zmq_setsockopt(replay_, ZMQ_SNDHWM, &replay_hwm, sizeof replay_hwm);
      const int no_linger = 0;
      zmq_setsockopt(replay_, ZMQ_LINGER, &no_linger, sizeof no_linger);
      replay_bound_ =
          bind_or_throw(replay_, options_.replay_endpoint, "--kv-events-replay-endpoint");
    }
  } catch (...) {
    if (replay_ != nullptr) zmq_close(replay_);
    if (socket_ != nullptr) zmq_close(socket_);
    zmq_ctx_term(context_);
    throw;
  }
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (replay_ != nullptr) zmq_close(replay_);
  zmq_close(socket_);
  zmq_ctx_term(context_);
}

void KvEventPublisher::publish(std::vector<KvCacheEvent> events) {
  if (events.empty()) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= options_.max_queue) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.emplace_back(now, std::move(events));
  }
  cv_.notify_one();
}

void KvEventPublisher::run() {
  // With a replay socket the sender also wakes to answer requests while no batch comes
  // (vLLM's publisher polls its ROUTER every 100 ms), and sooner while replies are under way.
  constexpr auto kReplayPoll = std::chrono::milliseconds(10);
  constexpr auto kReplayBusyPoll = std::chrono::milliseconds(1);
  for (;;) {
    std::optional<std::pair<double, std::vector<KvCacheEvent>>> batch;
    {
      std::unique_lock lock(mu_);
      const auto ready = [&] { return stopping_ || !queue_.empty(); };
      if (replay_ != nullptr) {
        cv_.wait_for(lock, replays_under_way_.empty() ? kReplayPoll : kReplayBusyPoll, ready);
      } else {
        cv_.wait(lock, ready);
      }
      if (!queue_.empty()) {
        batch = std::move(queue_.front());
        queue_.pop_front();
      } else if (stopping_) {
        return;  // everything was sent
      }
    }
    // Requests first, as vLLM's does: a reply holds every batch sent before it.
    if (replay_ != nullptr) serve_replays();
    if (batch) send_batch(next_seq_++, batch->first, batch->second);
  }
}

void KvEventPublisher::send_batch(uint64_t seq, double unix_seconds,
                                  const std::vector<KvCacheEvent>& events) {
  std::string payload = encode_kv_event_batch(unix_seconds, events, options_.encoding);
  const std::array<char, 8> number = big_endian(seq);
  // A PUB socket never blocks: past its high-water mark a slow subscriber misses messages.
  zmq_send(socket_, options_.topic.data(), options_.topic.size(), ZMQ_SNDMORE);
  zmq_send(socket_, number.data(), number.size(), ZMQ_SNDMORE);
  if (zmq_send(socket_, payload.data(), payload.size(), 0) >= 0) {
    ++sent_;
  } else {
    ++dropped_;
  }
  if (replay_ == nullptr) return;
  // Kept even when the send failed: its number was taken, and a replay can fill the gap.
  sent_buffer_bytes_ += payload.size();
  sent_buffer_.emplace_back(seq, std::move(payload));
  while (sent_buffer_.size() > options_.buffer_steps ||
         (sent_buffer_.size() > 1 && sent_buffer_bytes_ > options_.buffer_max_bytes)) {
    sent_buffer_bytes_ -= sent_buffer_.front().second.size();
    sent_buffer_.pop_front();
  }
}

void KvEventPublisher::serve_replays() {
  zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
  // Bounded per wake-up, so a flood of requests cannot starve the batches.
  for (int n = 0; n < 64 && zmq_poll(&item, 1, 0) > 0 && (item.revents & ZMQ_POLLIN); ++n) {
    std::vector<std::string> frames = receive_request(replay_);
    // [peer identity (the ROUTER's), empty delimiter, 8-byte big-endian start].
    const bool valid = frames.size() == 3 && frames[1].empty() && frames[2].size() == 8;
    if (!valid || replays_under_way_.size() >= kMaxPendingReplays) {
      if (refused_++ == 0) {
        std::fprintf(stderr,
                     valid ? "kv events: a replay request beyond the %zu replies under way gets "
                             "no reply; later ones are only counted\n"
                           : "kv events: a replay request of %zu frames (expected 3: the peer, "
                             "an empty delimiter, an 8-byte big-endian sequence number) gets no "
                             "reply; later ones are only counted\n",
                     valid ? kMaxPendingReplays : frames.size());
      }
      continue;
    }
    uint64_t start = 0;
    for (char c : frames[2]) start = start << 8 | static_cast<unsigned char>(c);
    replays_under_way_.push_back({.peer = std::move(frames[0]),
                                  .next = start,
                                  .end = next_seq_,
                                  .progress = std::chrono::steady_clock::now()});
  }
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(replays_under_way_, [&](Replay& r) {
    if (continue_replay(r)) {
      ++replays_;
      return true;
    }
    return now - r.progress > kReplayStall;  // its reader takes nothing: given up
  });
}

bool KvEventPublisher::continue_replay(Replay& r) {
  static const std::array<char, 8> kEnd = big_endian(~uint64_t{0});  // -1 as vLLM's END_SEQ
  // False when the reader's pipe is full (ZMQ_ROUTER_MANDATORY: EAGAIN, nothing sent) or the
  // reader is gone (EHOSTUNREACH: then the reply is over).
  bool gone = false;
  auto send = [&](std::string_view number, std::string_view payload) {
    if (zmq_send(replay_, r.peer.data(), r.peer.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
      gone = zmq_errno() != EAGAIN;
      return false;
    }
    zmq_send(replay_, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(replay_, number.data(), number.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(replay_, payload.data(), payload.size(), ZMQ_DONTWAIT);
    r.progress = std::chrono::steady_clock::now();
    return true;
  };
  if (!sent_buffer_.empty()) {
    // The buffer's numbers are consecutive: the first to send is found by subtraction (a
    // number evicted is skipped to the oldest kept).
    const uint64_t oldest = sent_buffer_.front().first;
    r.next = std::max(r.next, oldest);
    while (r.next < r.end && r.next - oldest < sent_buffer_.size()) {
      const auto& [number, payload] = sent_buffer_[static_cast<size_t>(r.next - oldest)];
      const std::array<char, 8> bytes = big_endian(number);
      if (!send(std::string_view(bytes.data(), bytes.size()), payload)) return gone;
      ++r.next;
    }
  }
  return send(std::string_view(kEnd.data(), kEnd.size()), "") || gone;
}

}  // namespace metrale::kvevents
