#pragma once
// metrale's one error type. Everything that comes from outside (files, configs, prompts,
// CLI arguments) is validated, and a failure says *where* (file, tensor, field) and *what*
// (expected vs found). Context is added as the error travels up, so the message reads
// outermost first: "loading /m/model.safetensors: tensor 'w': shape [2,3] x bf16 = 12 bytes,
// but its data_offsets span 10 bytes".
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace metrale {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(message), message_(std::move(message)) {}

  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is prefixed by `context: `.
  Error with_context(std::string_view context) const {
    return Error(std::string(context) + ": " + message_);
  }

 private:
  std::string message_;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Builds an Error from streamable pieces: `throw make_error("tensor '", name, "': ...");`
template <typename... Args>
Error make_error(Args&&... args) {
  return Error(detail::concat(std::forward<Args>(args)...));
}

// Runs `fn`; if it throws metrale::Error, rethrows it with `context` prepended.
template <typename Fn>
decltype(auto) with_context(std::string_view context, Fn&& fn) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const Error& e) {
    throw e.with_context(context);
  }
}

}  // namespace metrale

// Checks a condition on outside input; always on (never compiled out).
#define METRALE_CHECK(cond, ...)                           \
  do {                                                     \
    if (!(cond)) throw ::metrale::make_error(__VA_ARGS__); \
  } while (0)

// Programmer-error checks for hot loops: compiled out in release builds.
#ifdef NDEBUG
#define METRALE_DCHECK(cond) ((void)0)
#else
#include <cstdio>
#include <cstdlib>
#define METRALE_DCHECK(cond)                                                         \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: DCHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
#endif
