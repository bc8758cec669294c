#include "kvevents/kv_event_publisher.h"

#include <zmq.h>

#include <algorithm>
#include <array>
#include <chrono>
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

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options) : options_(std::move(options)) {
  METRALE_CHECK(!options_.endpoint.empty(), "--kv-events-endpoint: empty");
  METRALE_CHECK(options_.max_queue >= 1, "kv events: max_queue must be >= 1");
  context_ = zmq_ctx_new();
  METRALE_CHECK(context_ != nullptr, "kv events: cannot make a ZMQ context: ", zmq_error());
  socket_ = zmq_socket(context_, ZMQ_PUB);
  if (socket_ == nullptr) {
    zmq_ctx_term(context_);
    throw make_error("kv events: cannot make a ZMQ PUB socket: ", zmq_error());
  }
  // Closing sends what is queued for up to a second, then drops it.
  const int linger = 1000;
  zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger);
  const int hwm = static_cast<int>(std::min<size_t>(options_.max_queue, 1 << 30));
  zmq_setsockopt(socket_, ZMQ_SNDHWM, &hwm, sizeof hwm);
  if (zmq_bind(socket_, options_.endpoint.c_str()) != 0) {
    const std::string why = zmq_error();
    zmq_close(socket_);
    zmq_ctx_term(context_);
    throw make_error("--kv-events-endpoint ", options_.endpoint, ": cannot bind (", why,
                     "); expected a ZMQ endpoint such as tcp://*:5557 or ipc:///tmp/kv.sock");
  }
  std::array<char, 256> last{};
  size_t len = last.size();
  if (zmq_getsockopt(socket_, ZMQ_LAST_ENDPOINT, last.data(), &len) == 0) {
    bound_ = last.data();
  } else {
    bound_ = options_.endpoint;
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
  uint64_t seq = 0;
  for (;;) {
    std::pair<double, std::vector<KvCacheEvent>> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything was sent
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    const std::string payload = encode_kv_event_batch(batch.first, batch.second, options_.encoding);
    std::array<char, 8> number{};
    for (int i = 0; i < 8; ++i)
      number[static_cast<size_t>(i)] = static_cast<char>(seq >> (56 - 8 * i));
    ++seq;
    // A PUB socket never blocks: past its high-water mark a slow subscriber misses messages.
    zmq_send(socket_, options_.topic.data(), options_.topic.size(), ZMQ_SNDMORE);
    zmq_send(socket_, number.data(), number.size(), ZMQ_SNDMORE);
    if (zmq_send(socket_, payload.data(), payload.size(), 0) >= 0) {
      ++sent_;
    } else {
      ++dropped_;
    }
  }
}

}  // namespace metrale::kvevents
