#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

#include "chat/pystr.h"

namespace metrale::chat {
namespace {

// Structures from JSON nest at most kMaxJsonDepth (64) levels, but a template can build
// deeper ones (a list appended to itself); printing stops here instead of overflowing.
constexpr int kMaxPrintDepth = 200;

void check_bytes(const std::string& out, size_t max_bytes) {
  if (out.size() > max_bytes) {
    throw RenderFailure("printed value larger than " + std::to_string(max_bytes) + " bytes");
  }
}

void check_depth(int depth) {
  if (depth > kMaxPrintDepth) {
    throw RenderFailure("value nested more than " + std::to_string(kMaxPrintDepth) +
                        " levels deep (or containing itself)");
  }
}

void repr_into(std::string& out, const Value& v, int depth, size_t max_bytes);

void repr_string(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for_each_codepoint(s, [&](char32_t cp, std::string_view bytes) {
    if (cp == static_cast<char32_t>(quote) || cp == U'\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == U'\n') {
      out += "\\n";
    } else if (cp == U'\r') {
      out += "\\r";
    } else if (cp == U'\t') {
      out += "\\t";
    } else if (cp == kInvalidByte) {
      out += bytes;  // not valid UTF-8: no Python string holds it, pass the byte through
    } else if (!is_printable(cp)) {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      } else if (cp < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      out += bytes;
    }
  });
  out += quote;
}

void repr_into(std::string& out, const Value& v, int depth, size_t max_bytes) {
  check_depth(depth);
  check_bytes(out, max_bytes);
  if (v.is_string()) {
    repr_string(out, v.as_string());
  } else if (v.is_list()) {
    const List& l = v.as_list();
    if (l.kind == SeqKind::kGenerator || l.kind == SeqKind::kRange) {
      throw RenderFailure(std::string("unsupported: printing a ") + seq_type_name(l.kind) +
                          " (convert it with |list)");
    }
    const bool view = l.kind == SeqKind::kDictItems || l.kind == SeqKind::kDictKeys ||
                      l.kind == SeqKind::kDictValues;
    if (view) out += std::string(seq_type_name(l.kind)) + "(";
    out += l.is_tuple() ? '(' : '[';
    bool first = true;
    for (const Value& item : l) {
      if (!first) out += ", ";
      first = false;
      repr_into(out, item, depth + 1, max_bytes);
    }
    if (l.is_tuple() && l.size() == 1) out += ',';
    out += l.is_tuple() ? ')' : ']';
    if (view) out += ')';
  } else if (v.is_dict()) {
    const Dict& d = v.as_dict();
    if (d.is_namespace) out += "<Namespace ";
    out += '{';
    for (size_t i = 0; i < d.size(); ++i) {
      if (i > 0) out += ", ";
      repr_into(out, d.key(i), depth + 1, max_bytes);
      out += ": ";
      repr_into(out, d.items()[i].second, depth + 1, max_bytes);
    }
    out += '}';
    if (d.is_namespace) out += '>';
  } else {
    out += str_of(v, max_bytes);
  }
  check_bytes(out, max_bytes);
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for_each_codepoint(s, [&](char32_t cp, std::string_view bytes) {
    char buf[16];
    switch (cp) {
      case U'"':
        out += "\\\"";
        return;
      case U'\\':
        out += "\\\\";
        return;
      case U'\n':
        out += "\\n";
        return;
      case U'\r':
        out += "\\r";
        return;
      case U'\t':
        out += "\\t";
        return;
      case U'\b':
        out += "\\b";
        return;
      case U'\f':
        out += "\\f";
        return;
      default:
        break;
    }
    if (cp < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else if (cp == kInvalidByte || !ensure_ascii || cp < 0x80) {
      out += bytes;
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {  // a surrogate pair, as Python writes it
      const char32_t c = cp - 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (c >> 10)),
                    static_cast<unsigned>(0xDC00 + (c & 0x3FF)));
      out += buf;
    }
  });
  out += '"';
}

void json_into(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  check_depth(depth);
  check_bytes(out, o.max_bytes);
  const auto newline = [&](int level) {
    if (!o.indent) return;
    if (static_cast<uint64_t>(*o.indent) * static_cast<uint64_t>(level) > o.max_bytes) {
      throw RenderFailure("printed value larger than " + std::to_string(o.max_bytes) + " bytes");
    }
    out += '\n';
    out.append(static_cast<size_t>(*o.indent) * static_cast<size_t>(level), ' ');
  };
  const std::string& item_sep = o.item_separator;
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_float();
    if (std::isnan(d)) {
      out += "NaN";
    } else if (std::isinf(d)) {
      out += d > 0 ? "Infinity" : "-Infinity";
    } else {
      out += float_repr(d);
    }
  } else if (v.is_string()) {
    json_string(out, v.as_string(), o.ensure_ascii);
  } else if (v.is_list() && (v.as_list().kind == SeqKind::kList || v.as_list().is_tuple())) {
    const List& l = v.as_list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0) out += item_sep;
      newline(depth + 1);
      json_into(out, l[i], o, depth + 1);
    }
    newline(depth);
    out += ']';
  } else if (v.is_dict() && !v.as_dict().is_namespace) {
    const Dict& d = v.as_dict();
    if (d.size() == 0) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& item : d.items()) items.push_back(&item);
    if (o.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto* a, const auto* b) { return a->first < b->first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += item_sep;
      newline(depth + 1);
      json_string(out, items[i]->first, o.ensure_ascii);
      out += o.key_separator;
      json_into(out, items[i]->second, o, depth + 1);
    }
    newline(depth);
    out += '}';
  } else {
    throw RenderFailure("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

namespace {

// The index entry of a key: "s" + text for a string, "i" + digits for an int; nullopt for
// keys a template dict cannot hold here.
std::optional<std::string> index_key(const Value& key) {
  if (key.is_string()) return "s" + key.as_string();
  if (key.is_int()) return "i" + std::to_string(key.as_int());
  if (key.is_bool()) return std::string(key.as_bool() ? "i1" : "i0");
  if (key.is_float() && std::isfinite(key.as_float()) &&
      std::floor(key.as_float()) == key.as_float() && std::fabs(key.as_float()) < 9.2e18) {
    return "i" + std::to_string(static_cast<int64_t>(key.as_float()));
  }
  return std::nullopt;
}

}  // namespace

const Value* Dict::find(std::string_view key) const {
  const auto it = index_.find("s" + std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value* Dict::find(std::string_view key) {
  const auto it = index_.find("s" + std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  const std::optional<std::string> k = index_key(key);
  if (!k) return nullptr;
  const auto it = index_.find(*k);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const std::string& key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
    return;
  }
  index_.emplace("s" + key, items_.size());
  items_.emplace_back(key, std::move(value));
  int_key_.push_back(false);
}

void Dict::set_key(const Value& key, Value value) {
  if (key.is_string()) return set(key.as_string(), std::move(value));
  const std::optional<std::string> k = index_key(key);
  if (!k) throw RenderFailure("unsupported: dict keys of type " + type_name(key));
  const auto it = index_.find(*k);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(*k, items_.size());
  items_.emplace_back(k->substr(1), std::move(value));
  int_key_.push_back(true);
}

Value Dict::key(size_t i) const {
  if (int_key_[i]) return Value(static_cast<int64_t>(std::stoll(items_[i].first)));
  return Value(items_[i].first);
}

const char* seq_type_name(SeqKind kind) {
  switch (kind) {
    case SeqKind::kList:
      return "list";
    case SeqKind::kTuple:
      return "tuple";
    case SeqKind::kGenerator:
      return "generator";
    case SeqKind::kDictItems:
      return "dict_items";
    case SeqKind::kDictKeys:
      return "dict_keys";
    case SeqKind::kDictValues:
      return "dict_values";
    case SeqKind::kRange:
      return "range";
  }
  return "list";
}

std::string type_name(const Value& v) {
  if (v.is_undefined()) return "Undefined";
  if (v.is_none()) return "NoneType";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_float()) return "float";
  if (v.is_string()) return "str";
  if (v.is_list()) return seq_type_name(v.as_list().kind);
  if (v.is_dict()) return v.as_dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool truthy(const Value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool()) return v.as_bool();
  if (v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_float() != 0.0;
  if (v.is_string()) return !v.as_string().empty();
  if (v.is_list()) return v.as_list().kind == SeqKind::kGenerator || !v.as_list().empty();
  if (v.is_dict()) return v.as_dict().is_namespace || v.as_dict().size() != 0;
  return true;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // "-1.2345e-05": shortest round-trip digits
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out += '-';
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // digits = 0.d1d2... x 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out += digits.substr(1);
  }
  std::snprintf(buf, sizeof(buf), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  out += buf;
  return out;
}

std::string str_of(const Value& v, size_t max_bytes) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return v.as_string();
  if (v.is_callable()) return "<function " + v.as_function().name + ">";
  std::string out;
  repr_into(out, v, 0, max_bytes);
  return out;
}

std::string repr_of(const Value& v, size_t max_bytes) {
  if (v.is_undefined()) return "Undefined";
  std::string out;
  repr_into(out, v, 0, max_bytes);
  return out;
}

double to_double(const Value& v) {
  if (v.is_bool()) return v.as_bool() ? 1.0 : 0.0;
  if (v.is_int()) return static_cast<double>(v.as_int());
  return v.as_float();
}

namespace {

bool equals_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) {
      const int64_t x = a.is_int() ? a.as_int() : static_cast<int64_t>(a.as_bool());
      const int64_t y = b.is_int() ? b.as_int() : static_cast<int64_t>(b.as_bool());
      return x == y;
    }
    return to_double(a) == to_double(b);
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    if (&x == &y) return true;
    if (x.kind == SeqKind::kGenerator || y.kind == SeqKind::kGenerator) return false;
    if (x.size() != y.size() || x.kind != y.kind) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!equals_at(x[i], y[i], depth + 1)) return false;
    }
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const Dict& x = a.as_dict();
    const Dict& y = b.as_dict();
    if (&x == &y) return true;
    if (x.is_namespace || y.is_namespace || x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      const Value& item = x.items()[i].second;
      const Value* other = y.find(x.key(i));
      if (other == nullptr || !equals_at(item, *other, depth + 1)) return false;
    }
    return true;
  }
  if (a.is_callable() && b.is_callable()) return &a.as_function() == &b.as_function();
  return false;
}

bool less_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) return to_double(a) < to_double(b);
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.as_list().kind == b.as_list().kind &&
      a.as_list().indexable()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals_at(x[i], y[i], depth + 1)) return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  throw RenderFailure("'<' not supported between instances of '" + type_name(a) + "' and '" +
                      type_name(b) + "'");
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
bool less_than(const Value& a, const Value& b) { return less_at(a, b, 0); }

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  JsonDumpOptions o = options;
  if (o.item_separator.empty()) o.item_separator = o.indent ? "," : ", ";
  if (o.indent && *o.indent < 0) o.indent = 0;
  std::string out;
  json_into(out, v, o, 0);
  check_bytes(out, o.max_bytes);
  return out;
}

}  // namespace metrale::chat
