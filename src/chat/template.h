#pragma once
// A parsed jinja2 chat template and its renderer: the subset of jinja2 that checkpoints'
// chat templates use, with transformers' environment (trim_blocks, lstrip_blocks,
// loopcontrols, tojson without HTML escaping, raise_exception, strftime_now, namespace, dict).
// Every failure is a metrale::Error "<source>:<line>:<col>: <what>"; rendering is bounded in
// loop iterations, macro depth and output size, so no template or input can hang it.
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"

namespace metrale::chat {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // also bounds every string a template builds
  int64_t max_steps = 5'000'000;               // loop iterations + macro calls + range items
  int max_call_depth = 64;                     // nested macro calls
  // Bytes of strings (and list / dict slots) built by operators, filters, calls and slices,
  // summed over the render: bounds templates that re-copy big values in a loop.
  uint64_t max_work_bytes = uint64_t{4} << 30;
};

struct RenderOptions {
  RenderLimits limits;
  // The clock behind strftime_now (local time, as Python's datetime.now()); tests pin it.
  std::function<std::tm()> now;
};

class Template {
 public:
  // Parses `text`; `source_name` names it in every error ("tokenizer_config.json:chat_template").
  // Unknown filters and tests are refused here, as jinja2 refuses them at compile time.
  Template(std::string_view text, std::string source_name);

  // Renders with `context` as the template's variables.
  std::string render(const Dict& context, const RenderOptions& options) const;

  const std::string& source_name() const { return source_name_; }
  const std::string& text() const { return text_; }  // the template's source

 private:
  std::string source_name_;
  std::string text_;
  std::shared_ptr<const std::vector<NodePtr>> body_;
};

// ---- builtins (filters.cc, methods.cc), shared with the interpreter
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
// Applies filter `name` to `subject`; throws RenderFailure.
Value apply_filter(std::string_view name, const Value& subject, CallArgs& args,
                   const RenderLimits& limits);
bool apply_test(std::string_view name, const Value& subject, const std::vector<Value>& args);
// obj.name for a str, list or dict method, bound to obj; nullopt when there is none.
std::optional<Value> bound_method(const Value& obj, const std::string& name,
                                  const RenderLimits& limits);
// markupsafe's escape: & < > ' " as entities.
std::string html_escape(std::string_view s);
// `x in container` (Python semantics).
bool contains(const Value& container, const Value& item);
// The items a for loop or a filter iterates: list items, dict keys, string characters;
// undefined iterates as empty. Throws RenderFailure for anything else.
List iterate(const Value& v);
// The global functions (range, namespace, dict, raise_exception, strftime_now) as a dict;
// namespace() records each namespace it makes in `namespaces`.
Value make_globals(const RenderOptions& options, std::vector<std::shared_ptr<Dict>>* namespaces);

}  // namespace metrale::chat
