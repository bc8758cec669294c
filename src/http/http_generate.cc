// The generation endpoints of HttpServer (/v1/chat/completions, /v1/completions): the prompt
// rendered and encoded, its media loaded, its grammar compiled, its streams submitted, and the
// reply written whole or as server-sent events.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include "engine/session.h"
#include "http/http_server_impl.h"
#include "http/sockets.h"
#include "vision/decode.h"
#include "vision/preprocess.h"
#include "vision/processor_config.h"
#include "vision/video.h"

namespace metrale::http {

namespace {

// How a forced call is written: as the template spells it, after a <think> block the prompt
// opened.
ForcedCallOptions forced_call(const ReplyFormat& reply, const HttpServerOptions& options) {
  return {.spelling = options.tool_call_spelling,
          .reasoning_open =
              reply.reasoning != chat::ReasoningFormat::kNone && reply.reasoning_starts_open};
}

}  // namespace

std::vector<int32_t> HttpServer::Impl::encode_prompt(const OpenAiRequest& r,
                                                     std::string& rendered) const {
  if (r.kind == ApiKind::kCompletion) {
    if (r.prompt_is_ids) return r.prompt_ids;
    // A text prompt gets the tokenizer's special tokens (bos), as `metrale generate`,
    // vLLM and llama-server encode a completion prompt.
    return tok.encode(r.prompt_text, /*add_special_tokens=*/true);
  }
  if (!chat_template) {
    throw ApiError(400,
                   "this model has no chat template (neither chat_template.jinja nor "
                   "tokenizer_config.json's chat_template): start the server with "
                   "--chat-template FILE, or use /v1/completions",
                   "messages", "", "no_chat_template");
  }
  try {
    rendered = chat_template->render(r.chat);
  } catch (const Error& e) {
    throw ApiError(400, "chat template: " + e.message(), "messages");
  }
  // The rendered text already holds every special token the template wants (bos included):
  // encode it without adding more, as transformers' apply_chat_template(tokenize=True) and
  // vLLM do (llama-server gets the same ids by dropping a leading bos from the rendered text
  // and letting the tokenizer add it).
  return tok.encode(rendered, /*add_special_tokens=*/false);
}

std::vector<vision::VisionItem> HttpServer::Impl::load_media(const OpenAiRequest& r,
                                                             std::vector<int32_t>& prompt) const {
  std::vector<vision::VisionItem> items;
  if (r.media.empty()) return items;
  const MediaOptions& o = options.media;
  const VisionEncoder* vision = model.vision();
  if (static_cast<int64_t>(r.media.size()) > o.max_items) {
    const std::string& where = r.media[static_cast<size_t>(o.max_items)].where;
    throw ApiError(400,
                   where + ": " + std::to_string(r.media.size()) +
                       " images and videos in the request; at most " + std::to_string(o.max_items) +
                       " are accepted (--max-media-items)",
                   where);
  }
  for (const MediaPart& part : r.media) {
    const std::vector<uint8_t> bytes = read_media_part(part, o);
    try {
      vision::DecodeLimits limits;
      limits.max_pixels = o.max_image_pixels;
      if (part.kind == vision::VisionKind::kImage) {
        const vision::Image image = vision::decode_image(bytes, limits);
        items.push_back(
            vision::preprocess_image(image, vision::load_image_processor_config(model.dir())));
        continue;
      }
      vision::VideoOptions vo;
      vo.limits = limits;
      vo.max_frames = static_cast<size_t>(o.max_video_frames);
      const vision::VideoInfo info = vision::probe_video(bytes, vo);
      METRALE_CHECK(info.total_frames <= o.max_video_frames, "the video has ", info.total_frames,
                    " frames; at most ", o.max_video_frames, " are accepted (--max-video-frames)");
      const double fps = info.fps > 0 ? info.fps : 24.0;  // HF's default when unknown
      const double seconds = static_cast<double>(info.total_frames) / fps;
      METRALE_CHECK(seconds <= o.max_video_seconds, "the video lasts ", seconds, " s; at most ",
                    o.max_video_seconds, " s are accepted (--max-video-seconds)");
      const vision::VideoFrames frames = vision::decode_video(bytes, vo);
      METRALE_CHECK(!frames.frames.empty(), "the video decoded to no frames");
      items.push_back(vision::preprocess_video(frames.frames, frames.fps > 0 ? frames.fps : 24.0,
                                               vision::load_video_processor_config(model.dir())));
    } catch (const ApiError&) {
      throw;
    } catch (const Error& e) {
      throw ApiError(400, part.where + ": " + e.message(), part.where);
    }
  }
  try {
    prompt = place_media(vision->config(), prompt, items,
                         static_cast<int32_t>(model.config().bos_token_id.value_or(-1)),
                         model.tokenizer());
  } catch (const Error& e) {
    throw ApiError(400, "messages: " + e.message(), "messages");
  }
  return items;
}

std::shared_ptr<const CompiledGrammar> HttpServer::Impl::compile_grammar(const GrammarSpec& spec) {
  if (!grammar_available()) {
    throw ApiError(400,
                   "field '" + spec.field +
                       "': structured outputs are unavailable: this server was built without "
                       "xgrammar (scripts/fetch-xgrammar.sh)",
                   spec.field, "", "unsupported_parameter");
  }
  size_t bytes = spec.text.size() + spec.prefix.size() + spec.suffix.size();
  for (const std::string& c : spec.choices) bytes += c.size();
  if (bytes > options.max_grammar_bytes) {
    throw ApiError(400,
                   "field '" + spec.field + "': the grammar is " + std::to_string(bytes) +
                       " bytes; this server takes at most " +
                       std::to_string(options.max_grammar_bytes) + " (--max-grammar-bytes)",
                   spec.field);
  }
  std::call_once(grammar_once, [&] {
    grammar_compiler =
        std::make_unique<GrammarCompiler>(tok, model.vocab_size(), default_eos_ids(model));
  });
  try {
    return grammar_compiler->compile(spec);
  } catch (const Error& e) {
    throw ApiError(400, e.message(), spec.field);
  }
}

std::shared_ptr<ServeStream> HttpServer::Impl::submit(ServeRequest request) const {
  if (stopping) throw ApiError(503, "the server is stopping", "", "", "server_stopping");
  return scheduler.submit(std::move(request));
}

ServeRequest HttpServer::Impl::build_request(ApiKind kind, const OpenAiRequest& r,
                                             ReplyFormat& reply) const {
  const std::string adapter = adapter_of(r.model);
  // Media to a text-only model: refused before the template sees them.
  if (!r.media.empty() && model.vision() == nullptr) {
    throw ApiError(400,
                   r.media.front().where + ": this model (model_type \"" +
                       model.config().model_type +
                       "\") has no vision tower metrale runs, so it "
                       "takes no images or videos",
                   r.media.front().where);
  }
  std::string rendered;
  std::vector<int32_t> prompt = encode_prompt(r, rendered);
  std::vector<vision::VisionItem> media = load_media(r, prompt);
  if (kind == ApiKind::kChat) {
    reply.reasoning = options.reasoning_format;
    reply.reasoning_starts_open = chat::prompt_opens_reasoning(rendered);
    reply.include_reasoning = r.include_reasoning;
    if (r.wants_tool_calls) reply.tool_calls = options.tool_call_format;
    reply.tools = r.tools;
  }
  ServeRequest s = to_serve_request(r, std::move(prompt), model.context_limit(), model.vocab_size(),
                                    reply.tool_calls);
  s.adapter = adapter;
  s.media = std::move(media);
  return s;
}

void HttpServer::Impl::generate(ApiKind kind, const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
  const std::string body = read_body(req, res, reader);
  // Held until the response is written (a stream's state keeps it): drain() waits for it.
  std::shared_ptr<void> admitted = lifecycle.admit();
  if (!admitted) throw refuse_draining(res);
  const OpenAiRequest r =
      kind == ApiKind::kChat ? parse_chat_request(body) : parse_completion_request(body);
  ReplyFormat reply;
  ServeRequest s = build_request(kind, r, reply);
  const std::string adapter = s.adapter;
  if (r.forced_tool) {
    s.grammar = compile_grammar(forced_tool_call_grammar(r.tools, *r.forced_tool, reply.tool_calls,
                                                         forced_call(reply, options)));
  } else if (r.grammar) {
    s.grammar = compile_grammar(*r.grammar);
  }
  Streams streams;
  try {
    for (ServeRequest& choice : choice_requests(r, std::move(s))) {
      streams.push_back(submit(std::move(choice)));
    }
  } catch (...) {
    for (const auto& st : streams) st->cancel();  // all the choices or none
    throw;
  }
  ResponseMeta meta{
      (kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(streams.front()->id()),
      unix_now(), adapter.empty() ? model_name : r.model};  // vLLM echoes the adapter's name
  if (r.stream) {
    respond_streaming(kind, r, reply, std::move(streams), std::move(meta), std::move(admitted),
                      res);
  } else {
    respond_whole(kind, r, reply, streams, meta, req, res);
  }
}

void HttpServer::Impl::render(ApiKind kind, const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) {
  const std::string body = read_body(req, res, reader);
  // A draining replica takes no new work, and a router renders on the replica it may place a
  // request on: refused as a generation request is (503, Retry-After, the connection closed),
  // so the router's connections to it end and its drain can finish.
  if (lifecycle.draining()) throw refuse_draining(res);
  const OpenAiRequest r =
      kind == ApiKind::kChat ? parse_chat_request(body) : parse_completion_request(body);
  ReplyFormat reply;
  const ServeRequest s = build_request(kind, r, reply);
  // A grammar is compiled as the generation endpoint would, so a request that one refuses is
  // refused here too (a router must not place what cannot run).
  if (r.forced_tool) {
    compile_grammar(forced_tool_call_grammar(r.tools, *r.forced_tool, reply.tool_calls,
                                             forced_call(reply, options)));
  } else if (r.grammar) {
    compile_grammar(*r.grammar);
  }
  const int64_t id = render_ids.fetch_add(1) + 1;
  const std::string name = s.adapter.empty() ? model_name : r.model;
  if (kind == ApiKind::kChat) {
    send_json(
        res, 200,
        dump_json(generate_request_json(s, r.n, "chatcmpl-render-" + std::to_string(id), name)));
  } else {
    send_json(res, 200,
              dump_json(nlohmann::json::array(
                  {generate_request_json(s, r.n, "cmpl-render-" + std::to_string(id), name)})));
  }
}

void HttpServer::Impl::respond_whole(ApiKind kind, const OpenAiRequest& r, const ReplyFormat& reply,
                                     const Streams& streams, const ResponseMeta& meta,
                                     const httplib::Request& req, httplib::Response& res) {
  const int fd = find_connection_socket(req);
  std::vector<Collected> choices(streams.size());
  auto cancel_all = [&] {
    for (const auto& st : streams) st->cancel();
  };
  std::vector<ServeEvent> events;
  // The client is checked every poll_interval, whether tokens are flowing or not: a request
  // decoding steadily must notice a hang-up as soon as a waiting one.
  auto next_check = std::chrono::steady_clock::now() + options.poll_interval;
  const auto wait = wait_per_stream(options.poll_interval, streams.size());
  auto all_done = [&] {
    return std::all_of(choices.begin(), choices.end(), [](const Collected& c) { return c.done; });
  };
  while (!all_done()) {
    if (stopping) {
      cancel_all();
      throw ApiError(503, "the server is stopping", "", "", "server_stopping");
    }
    if (lifecycle.ending()) {  // the drain's time is up
      cancel_all();
      res.set_header("Retry-After", "1");
      res.set_header("Connection", "close");
      throw ApiError(503, "the server shut down before the request finished; retry it", "", "",
                     "server_shutting_down");
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (choices[i].done) continue;
      events.clear();
      streams[i]->next(events, wait);
      for (ServeEvent& e : events) choices[i].add(e);
      // A choice that failed fails the request: the others need not run on.
      if (choices[i].done && failed(choices[i].finish)) cancel_all();
    }
    if (all_done()) break;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check) continue;
    next_check = now + options.poll_interval;
    if (peer_gone(fd)) {
      // Nobody will read the answer: free the sequences now. 499 ("client closed request",
      // nginx's code) only shows in the logs and /metrics.
      cancel_all();
      ++client_disconnects;
      res.status = 499;
      return;
    }
  }
  const char* endpoint = kind == ApiKind::kChat ? "chat" : "completions";
  for (const Collected& choice : choices) count_finish(endpoint, choice.finish);
  // The request fails as its first failing choice does.
  const auto first_failed = std::find_if(choices.begin(), choices.end(),
                                         [](const Collected& x) { return failed(x.finish); });
  const Collected& c = first_failed != choices.end() ? *first_failed : choices.front();
  switch (c.finish) {
    case FinishReason::kStop:
    case FinishReason::kLength: {
      const bool logprobs = r.top_logprobs >= 0;
      send_json(res, 200,
                dump_json(kind == ApiKind::kChat
                              ? chat_completion_json(meta, choices, logprobs, tok, reply)
                              : text_completion_json(meta, choices, logprobs, tok)));
      return;
    }
    case FinishReason::kTimeout:
      throw ApiError(503,
                     "the request timed out after generating " +
                         std::to_string(c.usage.completion_tokens) + " tokens",
                     "", "", "timeout");
    case FinishReason::kCancelled:
      throw ApiError(503, "the request was cancelled", "", "", "cancelled");
    case FinishReason::kError:
      throw ApiError(500, "generation failed: " + c.error);
  }
}

void HttpServer::Impl::respond_streaming(ApiKind kind, const OpenAiRequest& r,
                                         const ReplyFormat& reply, Streams streams,
                                         ResponseMeta meta, std::shared_ptr<void> admitted,
                                         httplib::Response& res) {
  // The provider runs on this connection's thread after the handler returns, once per chunk,
  // until sink.done(). Whatever ends it early (a failed write, a dead socket, the server
  // stopping) leaves `finished` false, and the releaser cancels the streams.
  struct State {
    Streams streams;  // one per choice
    SseEncoder encoder;
    std::vector<bool> done;  // the choice's last event was read
    std::vector<ServeEvent> events;
    bool finished = false;
    std::chrono::steady_clock::time_point next_check;
    std::shared_ptr<void> admitted;  // the Lifecycle token: released with the state
    void cancel_all() const {
      for (const auto& st : streams) st->cancel();
    }
  };
  const auto n = static_cast<int>(streams.size());
  auto state = std::make_shared<State>(
      State{std::move(streams),
            SseEncoder(kind, std::move(meta), r.top_logprobs >= 0, r.include_usage, tok, reply, n),
            std::vector<bool>(static_cast<size_t>(n), false),
            {},
            false,
            std::chrono::steady_clock::now() + options.poll_interval,
            std::move(admitted)});
  const char* endpoint = kind == ApiKind::kChat ? "chat" : "completions";
  // With several choices each is polled in turn for a share of the interval.
  const auto wait = wait_per_stream(options.poll_interval, static_cast<size_t>(n));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // proxies must not hold events back
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state, endpoint, wait](size_t /*offset*/, httplib::DataSink& sink) {
        if (lifecycle.ending()) {
          // The drain's time is up: the stream ends cleanly (an error event the OpenAI SDKs
          // raise, then [DONE]) rather than with a cut connection.
          state->cancel_all();
          const std::string last = state->encoder.fail(
              503, "the server shut down before the stream finished", "server_shutting_down");
          state->finished = true;
          if (!last.empty() && !sink.write(last.data(), last.size())) return false;
          sink.done();
          return true;
        }
        std::string out;
        bool got = false;
        for (size_t i = 0; i < state->streams.size(); ++i) {
          if (state->done[i]) continue;
          state->events.clear();
          if (!state->streams[i]->next(state->events, wait)) continue;
          got = true;
          for (const ServeEvent& e : state->events) {
            out += state->encoder.encode(e, static_cast<int>(i));
            if (e.done) {
              state->done[i] = true;
              count_finish(endpoint, e.finish);
              // A choice that failed ends the stream: the others need not run on.
              if (failed(e.finish)) state->cancel_all();
            }
          }
        }
        // Is anyone still listening? Checked every poll_interval (a write to a closed
        // connection fails too, but only once text is written: a queued request, a long
        // prefill or text held back by a stop string writes nothing). is_writable() also
        // peeks the socket, so a closed connection shows here.
        const auto now = std::chrono::steady_clock::now();
        if (!got || now >= state->next_check) {
          state->next_check = now + options.poll_interval;
          if (stopping || !sink.is_writable()) {
            if (!stopping) ++client_disconnects;
            state->cancel_all();
            return false;
          }
        }
        if (!got) return true;
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          ++client_disconnects;
          state->cancel_all();
          return false;
        }
        if (state->encoder.finished()) {
          state->finished = true;
          sink.done();
        }
        return true;
      },
      [state](bool /*success*/) {
        if (!state->finished) state->cancel_all();
      });
}

}  // namespace metrale::http
