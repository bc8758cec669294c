#include "chat/reasoning.h"

#include "core/error.h"

namespace metrale::chat {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(s.substr(s.size() - n))) return n;
  }
  return 0;
}

}  // namespace

std::string_view reasoning_format_name(ReasoningFormat f) {
  return f == ReasoningFormat::kThink ? "think" : "none";
}

ReasoningFormat reasoning_format_from_name(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "think") return ReasoningFormat::kThink;
  throw make_error("unknown reasoning format '", name, "' (expected none or think)");
}

ReasoningFormat detect_reasoning_format(std::string_view template_source) {
  return template_source.find(kClose) != std::string_view::npos ? ReasoningFormat::kThink
                                                                : ReasoningFormat::kNone;
}

bool prompt_opens_reasoning(std::string_view rendered_prompt) {
  size_t end = rendered_prompt.size();
  while (end > 0 && is_space(rendered_prompt[end - 1])) --end;
  return rendered_prompt.substr(0, end).ends_with(kOpen);
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool starts_open)
    : state_(format == ReasoningFormat::kNone ? State::kContent
                                              : (starts_open ? State::kReasoning : State::kStart)),
      content_begun_(format == ReasoningFormat::kNone) {}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
  buffer_.append(text);
  return step(/*at_end=*/false);
}

ReasoningDelta ReasoningParser::finish() { return step(/*at_end=*/true); }

ReasoningDelta ReasoningParser::parse(ReasoningFormat format, bool starts_open,
                                      std::string_view text) {
  ReasoningParser p(format, starts_open);
  ReasoningDelta out = p.feed(text);
  ReasoningDelta last = p.finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  return out;
}

ReasoningDelta ReasoningParser::step(bool at_end) {
  ReasoningDelta out;
  // Releases a piece of reasoning: newlines at its very start are dropped, newlines at its
  // end wait until more reasoning follows (dropped when the block ends).
  auto release_reasoning = [&](std::string_view piece, bool block_ends) {
    if (!reasoning_begun_) {
      while (!piece.empty() && piece.front() == '\n') piece.remove_prefix(1);
    }
    size_t body = piece.size();
    while (body > 0 && piece[body - 1] == '\n') --body;
    if (body > 0) {
      out.reasoning += pending_newlines_;
      out.reasoning.append(piece.substr(0, body));
      pending_newlines_.assign(piece.substr(body));
      reasoning_begun_ = true;
    } else if (reasoning_begun_) {
      pending_newlines_.append(piece);
    }
    if (block_ends) pending_newlines_.clear();
  };

  while (true) {
    if (state_ == State::kStart) {
      size_t ws = 0;
      while (ws < buffer_.size() && is_space(buffer_[ws])) ++ws;
      const std::string_view rest = std::string_view(buffer_).substr(ws);
      if (rest.starts_with(kOpen)) {
        buffer_.erase(0, ws + kOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      if (!at_end && kOpen.starts_with(rest)) return out;  // may still open a block
      // No block: the reply is content, as it is.
      state_ = State::kContent;
      content_begun_ = true;
      continue;
    }
    if (state_ == State::kReasoning) {
      const size_t close = buffer_.find(kClose);
      if (close != std::string::npos) {
        release_reasoning(std::string_view(buffer_).substr(0, close), /*block_ends=*/true);
        buffer_.erase(0, close + kClose.size());
        state_ = State::kContent;
        continue;
      }
      const size_t keep = at_end ? 0 : partial_marker_suffix(buffer_, kClose);
      release_reasoning(std::string_view(buffer_).substr(0, buffer_.size() - keep), at_end);
      buffer_.erase(0, buffer_.size() - keep);
      return out;
    }
    // kContent
    if (!content_begun_) {
      size_t ws = 0;
      while (ws < buffer_.size() && is_space(buffer_[ws])) ++ws;
      buffer_.erase(0, ws);
      if (buffer_.empty()) return out;
      content_begun_ = true;
    }
    out.content += buffer_;
    buffer_.clear();
    return out;
  }
}

}  // namespace metrale::chat
