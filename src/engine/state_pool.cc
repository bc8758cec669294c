#include "engine/state_pool.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace metrale {
namespace {

constexpr size_t kStateAlign = 64;

// a * b, or nullopt past 2^64 - 1.
std::optional<uint64_t> mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
std::optional<uint64_t> add(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// "3211264 bytes (3.1 MiB)".
std::string bytes_str(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes (%.1f MiB)", bytes,
                static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}
std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// Layer indices as comma-separated runs: {0, 2, 3} -> "0,2-3".
std::string ranges(const std::vector<int64_t>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    os << (i ? "," : "") << v[i];
    if (j > i) os << "-" << v[j];
    i = j + 1;
  }
  return os.str();
}

size_t align_up(size_t n, size_t a, const char* what) {
  METRALE_CHECK(n <= std::numeric_limits<size_t>::max() - (a - 1), "state layout: ", what,
                " offset ", n, " overflows size_t");
  return (n + a - 1) / a * a;
}

// The plan's arithmetic for one ring depth: every term checked.
struct Totals {
  uint64_t slot_bytes = 0, snapshot_bytes = 0, total_bytes = 0;
};
Totals totals(int64_t slots, int64_t depth, int64_t snapshot_slots, size_t block_bytes) {
  const auto fail = [&]() {
    return make_error("state reserve: ", slots, " slots x ", depth, " + 1 versions x ", block_bytes,
                      "-byte blocks + ", snapshot_slots, " snapshot blocks overflows 64 bits");
  };
  Totals t;
  const std::optional<uint64_t> versions = add(static_cast<uint64_t>(depth), 1);
  if (!versions) throw fail();
  const std::optional<uint64_t> slot = mul(*versions, block_bytes);
  const std::optional<uint64_t> live = slot ? mul(static_cast<uint64_t>(slots), *slot) : slot;
  const std::optional<uint64_t> snap = mul(static_cast<uint64_t>(snapshot_slots), block_bytes);
  const std::optional<uint64_t> total = live && snap ? add(*live, *snap) : std::nullopt;
  if (!total || *total > std::numeric_limits<size_t>::max()) throw fail();
  t.slot_bytes = *slot;
  t.snapshot_bytes = *snap;
  t.total_bytes = *total;
  return t;
}

// "2 slots x 1 version x 3211264-byte blocks + 0 snapshot blocks = 6422528 bytes (6.1 MiB)".
std::string sum_str(int64_t slots, int64_t depth, int64_t snapshot_slots, size_t block_bytes,
                    uint64_t total) {
  std::ostringstream os;
  os << plural(slots, "slot", "slots") << " x " << plural(depth + 1, "version", "versions") << " x "
     << block_bytes << "-byte blocks (" << mib(block_bytes) << ") + "
     << plural(snapshot_slots, "snapshot block", "snapshot blocks") << " = " << bytes_str(total);
  return os.str();
}

}  // namespace

std::vector<LayerStateShape> linear_state_shapes(const ModelConfig& config) {
  std::vector<LayerStateShape> shapes(static_cast<size_t>(std::max<int64_t>(config.n_layers, 0)));
  for (int64_t i = 0; i < config.n_layers; ++i) {
    if (config.layer_kind(i) != LayerKind::kLinearAttention) continue;
    const LinearAttentionConfig& l = config.linear;
    METRALE_CHECK(
        l.n_key_heads > 0 && l.n_value_heads > 0 && l.key_head_dim > 0 && l.value_head_dim > 0,
        config.source, ": layer ", i,
        " is linear_attention but the linear widths are not all positive "
        "(linear_num_key_heads ",
        l.n_key_heads, ", linear_num_value_heads ", l.n_value_heads, ", linear_key_head_dim ",
        l.key_head_dim, ", linear_value_head_dim ", l.value_head_dim, ")");
    METRALE_CHECK(l.conv_kernel_dim >= 2, config.source,
                  ": linear_conv_kernel_dim: expected at least 2 (the conv state keeps K - 1 "
                  "inputs), found ",
                  l.conv_kernel_dim);
    // Each field is at most 2^31 (JsonFields::req_size); the products are checked anyway.
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    const std::optional<uint64_t> qk = mul(2 * u(l.n_key_heads), u(l.key_head_dim));
    const std::optional<uint64_t> v = mul(u(l.n_value_heads), u(l.value_head_dim));
    const std::optional<uint64_t> channels = qk && v ? add(*qk, *v) : std::nullopt;
    const std::optional<uint64_t> conv =
        channels ? mul(u(l.conv_kernel_dim - 1), *channels) : std::nullopt;
    const std::optional<uint64_t> ssm = v ? mul(*v, u(l.key_head_dim)) : std::nullopt;
    constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    METRALE_CHECK(conv && ssm && *conv <= kMax && *ssm <= kMax, config.source,
                  ": the linear-attention state of layer ", i, " overflows 63 bits");
    shapes[static_cast<size_t>(i)] = {.conv_elems = static_cast<int64_t>(*conv),
                                      .ssm_elems = static_cast<int64_t>(*ssm)};
  }
  return shapes;
}

int64_t StateLayout::n_state_layers() const {
  return std::count_if(layers.begin(), layers.end(), [](const Layer& l) { return l.has_state; });
}

StateLayout layout_states(std::span<const LayerStateShape> shapes, DType dtype) {
  METRALE_CHECK(dtype == DType::kF32 || dtype == DType::kF16, "state layout: dtype ",
                dtype_name(dtype), " is not a state storage type (expected f32 or f16)");
  const size_t elem = dtype == DType::kF32 ? 4 : 2;
  StateLayout out;
  out.dtype = dtype;
  out.layers.resize(shapes.size());
  size_t at = 0;
  const auto region = [&](int64_t elems, size_t layer, const char* what, size_t& offset,
                          size_t& bytes) {
    const std::optional<uint64_t> b = mul(static_cast<uint64_t>(elems), elem);
    METRALE_CHECK(b && *b <= std::numeric_limits<size_t>::max() - at, "state layout: layer ", layer,
                  " ", what, " state of ", elems, " elements overflows size_t");
    offset = align_up(at, kStateAlign, what);
    bytes = static_cast<size_t>(*b);
    METRALE_CHECK(bytes <= std::numeric_limits<size_t>::max() - offset, "state layout: layer ",
                  layer, " ", what, " state of ", elems, " elements overflows size_t");
    at = offset + bytes;
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    const LayerStateShape& s = shapes[i];
    METRALE_CHECK(s.conv_elems >= 0 && s.ssm_elems >= 0, "state layout: layer ", i,
                  ": negative state shape (conv ", s.conv_elems, ", ssm ", s.ssm_elems,
                  " elements)");
    if (s.conv_elems == 0 && s.ssm_elems == 0) continue;
    StateLayout::Layer& l = out.layers[i];
    l.has_state = true;
    region(s.conv_elems, i, "conv", l.conv_offset, l.conv_bytes);
    region(s.ssm_elems, i, "ssm", l.ssm_offset, l.ssm_bytes);
  }
  out.block_bytes = align_up(at, kStateAlign, "block end");
  return out;
}

StateReservePlan plan_state_reserve(const StateReserveRequest& r) {
  METRALE_CHECK(r.max_seqs >= 1, "state reserve: max_seqs: expected at least 1, found ",
                r.max_seqs);
  // Slot indices are int32 (StatePool::acquire), the dummy included.
  METRALE_CHECK(r.max_seqs < std::numeric_limits<int32_t>::max(),
                "state reserve: max_seqs: expected at most ",
                std::numeric_limits<int32_t>::max() - 1, ", found ", r.max_seqs);
  METRALE_CHECK(r.block_bytes > 0,
                "state reserve: block_bytes: expected a positive size, found 0 (no layer "
                "holds recurrent state)");
  METRALE_CHECK(r.snapshot_slots >= 0, "state reserve: snapshot_slots: expected >= 0, found ",
                r.snapshot_slots);
  METRALE_CHECK(!r.ring_depth || *r.ring_depth >= 0,
                "state reserve: ring_depth: expected >= 0, found ", r.ring_depth.value_or(0));

  StateReservePlan p;
  p.max_seqs = r.max_seqs;
  p.slots = r.max_seqs + 1;
  p.snapshot_slots = r.snapshot_slots;
  p.block_bytes = r.block_bytes;
  p.budget = r.budget;
  p.forced = r.ring_depth.has_value();

  const auto fits = [&](uint64_t total) { return !r.budget || total <= *r.budget; };
  const auto take = [&](int64_t depth, const Totals& t) {
    p.ring_depth = depth;
    p.versions = depth + 1;
    p.slot_bytes = t.slot_bytes;
    p.snapshot_bytes = t.snapshot_bytes;
    p.total_bytes = t.total_bytes;
  };

  if (r.ring_depth) {
    const int64_t depth = *r.ring_depth;
    const Totals t = totals(p.slots, depth, p.snapshot_slots, p.block_bytes);
    p.tried.emplace_back(depth, t.total_bytes);
    METRALE_CHECK(fits(t.total_bytes), "state reserve: ring depth ", depth, " (forced): ",
                  sum_str(p.slots, depth, p.snapshot_slots, p.block_bytes, t.total_bytes),
                  " exceed the budget of ", bytes_str(*r.budget));
    take(depth, t);
    return p;
  }

  std::optional<size_t> chosen;
  std::vector<Totals> all;
  for (int64_t depth : kStateRingLadder) {
    all.push_back(totals(p.slots, depth, p.snapshot_slots, p.block_bytes));
    p.tried.emplace_back(depth, all.back().total_bytes);
    if (!chosen && fits(all.back().total_bytes)) chosen = all.size() - 1;
  }
  if (!chosen) {
    const int64_t smallest = std::end(kStateRingLadder)[-1];
    throw make_error(
        "state reserve: ", plural(p.max_seqs, "sequence", "sequences"), " + 1 padding dummy: ",
        sum_str(p.slots, smallest, p.snapshot_slots, p.block_bytes, all.back().total_bytes),
        " exceed the budget of ", bytes_str(*r.budget), " even with no rollback (ring depth ",
        smallest,
        "); lower the batch or the snapshot count, store the state in f16, or raise "
        "the budget");
  }
  take(kStateRingLadder[*chosen], all[*chosen]);
  return p;
}

std::string describe(const StateReservePlan& plan, const StateLayout& layout) {
  std::ostringstream os;
  std::vector<int64_t> state_layers;
  bool uniform = true;
  const StateLayout::Layer* first = nullptr;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const StateLayout::Layer& l = layout.layers[i];
    if (!l.has_state) continue;
    state_layers.push_back(static_cast<int64_t>(i));
    if (first == nullptr)
      first = &l;
    else if (l.conv_bytes != first->conv_bytes || l.ssm_bytes != first->ssm_bytes)
      uniform = false;
  }
  os << "recurrent state: " << dtype_name(layout.dtype) << ", " << state_layers.size() << " of "
     << layout.layers.size() << " layers ("
     << (state_layers.empty() ? "none" : ranges(state_layers)) << ")\n";
  if (first != nullptr && uniform) {
    os << "  per layer: conv " << first->conv_bytes << " + ssm " << first->ssm_bytes << " bytes\n";
  } else {
    for (int64_t i : state_layers) {
      const StateLayout::Layer& l = layout.layers[static_cast<size_t>(i)];
      os << "  layer " << i << ": conv " << l.conv_bytes << " + ssm " << l.ssm_bytes << " bytes\n";
    }
  }
  os << "  block (every layer's state after one token): " << bytes_str(plan.block_bytes) << "\n";
  os << "slots: " << plan.slots << " (" << plural(plan.max_seqs, "sequence", "sequences")
     << " + 1 padding dummy)\n";
  os << "ring depth: " << plan.ring_depth << " (" << plural(plan.versions, "version", "versions")
     << " per slot, " << bytes_str(plan.slot_bytes) << ")" << (plan.forced ? ", forced" : "")
     << "\n";
  os << "  budget: " << (plan.budget ? bytes_str(*plan.budget) : std::string("none")) << "\n";
  for (const auto& [depth, total] : plan.tried) {
    const bool fits = !plan.budget || total <= *plan.budget;
    os << "  depth " << depth << ": " << bytes_str(total) << (fits ? "" : ", over budget")
       << (depth == plan.ring_depth ? "  <- chosen" : "") << "\n";
  }
  os << "snapshot slots: " << plan.snapshot_slots << " (" << bytes_str(plan.snapshot_bytes)
     << ")\n";
  os << "total: " << bytes_str(plan.total_bytes) << "\n";
  return os.str();
}

uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  const auto bad = [&](std::string_view why) {
    return make_error(what,
                      ": expected a byte count such as 1073741824, 512MiB, 2GiB or 1GB, "
                      "found \"",
                      text, "\" (", why, ")");
  };
  size_t i = 0;
  uint64_t n = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const std::optional<uint64_t> next = mul(n, 10);
    const std::optional<uint64_t> sum =
        next ? add(*next, static_cast<uint64_t>(text[i] - '0')) : next;
    if (!sum) throw bad("more than 2^64 - 1 bytes");
    n = *sum;
  }
  if (i == 0) throw bad("no leading number");
  if (i < text.size() && (text[i] == '.' || text[i] == ','))
    throw bad("whole numbers only; use a smaller unit, e.g. 1536MiB");
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit;
  for (; i < text.size(); ++i)
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  static constexpr std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", uint64_t{1} << 10},
      {"ki", uint64_t{1} << 10},
      {"kib", uint64_t{1} << 10},
      {"kb", 1000},
      {"m", uint64_t{1} << 20},
      {"mi", uint64_t{1} << 20},
      {"mib", uint64_t{1} << 20},
      {"mb", 1000 * 1000},
      {"g", uint64_t{1} << 30},
      {"gi", uint64_t{1} << 30},
      {"gib", uint64_t{1} << 30},
      {"gb", 1000 * 1000 * 1000},
      {"t", uint64_t{1} << 40},
      {"ti", uint64_t{1} << 40},
      {"tib", uint64_t{1} << 40},
      {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
  };
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const std::optional<uint64_t> bytes = mul(n, scale);
    if (!bytes) throw bad("more than 2^64 - 1 bytes");
    return *bytes;
  }
  throw bad("unknown unit \"" + unit + "\"; units: B, KiB, MiB, GiB, TiB (K, M, G, T), KB, MB, " +
            "GB, TB");
}

StatePool::StatePool(Backend& backend, const StateReservePlan& plan, StateLayout layout)
    : backend_(&backend), plan_(plan), layout_(std::move(layout)) {
  METRALE_CHECK(plan_.block_bytes == layout_.block_bytes && plan_.block_bytes > 0 &&
                    plan_.block_bytes % kStateAlign == 0,
                "state pool: the plan's block_bytes ", plan_.block_bytes,
                " differ from the layout's ", layout_.block_bytes,
                " (or are not a positive "
                "multiple of 64)");
  METRALE_CHECK(plan_.max_seqs >= 1 && plan_.slots == plan_.max_seqs + 1 &&
                    plan_.slots <= std::numeric_limits<int32_t>::max() && plan_.ring_depth >= 0 &&
                    plan_.versions == plan_.ring_depth + 1 && plan_.snapshot_slots >= 0,
                "state pool: inconsistent plan (max_seqs ", plan_.max_seqs, ", slots ", plan_.slots,
                ", ring depth ", plan_.ring_depth, ", versions ", plan_.versions,
                ", snapshot slots ", plan_.snapshot_slots, ")");
  const Totals t = totals(plan_.slots, plan_.ring_depth, plan_.snapshot_slots, plan_.block_bytes);
  METRALE_CHECK(t.slot_bytes == plan_.slot_bytes && t.snapshot_bytes == plan_.snapshot_bytes &&
                    t.total_bytes == plan_.total_bytes,
                "state pool: the plan's totals do not add up: slot ", plan_.slot_bytes,
                " (expected ", t.slot_bytes, "), snapshots ", plan_.snapshot_bytes, " (expected ",
                t.snapshot_bytes, "), total ", plan_.total_bytes, " (expected ", t.total_bytes,
                ")");
  METRALE_CHECK(!plan_.budget || plan_.total_bytes <= *plan_.budget, "state pool: the plan's ",
                bytes_str(plan_.total_bytes), " exceed its budget of ", bytes_str(*plan_.budget));
  buffer_ = backend.allocate(static_cast<size_t>(plan_.total_bytes));
  METRALE_CHECK(buffer_ && buffer_.size() == plan_.total_bytes, "state pool: backend ",
                backend.name(), " returned ", buffer_.size(), " bytes for a plan of ",
                plan_.total_bytes);
  owner_.assign(static_cast<size_t>(plan_.slots - 1), nullptr);
}

int64_t StatePool::free_slots() const { return plan_.max_seqs - in_use_; }

int32_t StatePool::acquire(const void* owner) {
  METRALE_CHECK(owner != nullptr, "state pool: acquire with a null owner");
  int32_t slot = -1;
  for (size_t i = 0; i < owner_.size(); ++i) {
    METRALE_CHECK(owner_[i] != owner, "state pool: the sequence already holds state slot ", i);
    if (slot < 0 && owner_[i] == nullptr) slot = static_cast<int32_t>(i);
  }
  METRALE_CHECK(slot >= 0, "state pool full: ", in_use_, " slots in use (max_seqs ", plan_.max_seqs,
                ")");
  owner_[static_cast<size_t>(slot)] = owner;
  ++in_use_;
  // The slot's versions are contiguous: zero them in one pass.
  backend_->zero(block(slot, 0), static_cast<size_t>(plan_.slot_bytes));
  return slot;
}

void StatePool::check_owner(int32_t slot, const void* owner) const {
  METRALE_CHECK(slot >= 0 && slot < plan_.slots, "state slot ", slot, " is out of range [0, ",
                plan_.slots, ")");
  METRALE_CHECK(slot != dummy_slot(), "state slot ", slot,
                " is the padding dummy, held by no sequence");
  const void* held = owner_[static_cast<size_t>(slot)];
  METRALE_CHECK(held != nullptr, "state slot ", slot, " is free, not held by this sequence");
  METRALE_CHECK(held == owner, "state slot ", slot, " is held by another sequence");
}

void StatePool::release(int32_t slot, const void* owner) {
  with_context("state pool: release", [&] { check_owner(slot, owner); });
  owner_[static_cast<size_t>(slot)] = nullptr;
  --in_use_;
}

std::byte* StatePool::block(int32_t slot, int64_t version) const {
  METRALE_CHECK(slot >= 0 && slot < plan_.slots, "state pool: slot ", slot, " is out of range [0, ",
                plan_.slots, ")");
  METRALE_CHECK(version >= 0 && version < plan_.versions, "state pool: version ", version,
                " is out of range [0, ", plan_.versions, ")");
  const auto index = static_cast<size_t>(slot) * static_cast<size_t>(plan_.versions) +
                     static_cast<size_t>(version);
  return buffer_.as<std::byte>() + index * plan_.block_bytes;
}

std::byte* StatePool::snapshot_block(int64_t index) const {
  METRALE_CHECK(index >= 0 && index < plan_.snapshot_slots, "state pool: snapshot ", index,
                " is out of range [0, ", plan_.snapshot_slots, ")");
  return buffer_.as<std::byte>() + static_cast<size_t>(plan_.slots) * plan_.slot_bytes +
         static_cast<size_t>(index) * plan_.block_bytes;
}

void StatePool::copy_block(const std::byte* from, std::byte* to, size_t bytes) const {
  backend_->copy(to, from, bytes);
}

void StatePool::zero_block(std::byte* b) const {
  const auto base = reinterpret_cast<uintptr_t>(buffer_.data());
  const auto at = reinterpret_cast<uintptr_t>(b);
  METRALE_CHECK(at >= base && at - base < plan_.total_bytes && (at - base) % plan_.block_bytes == 0,
                "state pool: zero_block of a pointer that is not a block of this pool");
  backend_->zero(b, plan_.block_bytes);
}

}  // namespace metrale
