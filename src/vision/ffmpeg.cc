// Child processes for ffmpeg/ffprobe. The child runs in its own process group so a timeout
// kills ffmpeg together with anything it (or a wrapper script) started, and nothing is left
// holding our pipes open.
#include "vision/ffmpeg.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

extern char** environ;

namespace metrale::vision {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Pipe {
  Fd read, write;
  Pipe() {
    int fds[2];
    METRALE_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "cannot create a pipe: ", std::strerror(errno));
    read.fd = fds[0];
    write.fd = fds[1];
  }
};

std::string tail(const std::string& s, size_t n = 2000) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

bool file_executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!rest.empty()) {
    size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (file_executable(candidate)) return candidate;
  }
  return "";
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  METRALE_CHECK(!argv.empty(), "run_process: empty argv");
  Pipe out, err;
  Fd null_in;
  null_in.fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  METRALE_CHECK(null_in.fd >= 0, "cannot open /dev/null: ", std::strerror(errno));

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, null_in.fd, 0);
  posix_spawn_file_actions_adddup2(&actions, out.write.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err.write.fd, 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t default_signals;
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &default_signals);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const bool search = argv[0].find('/') == std::string::npos;
  const int rc = search
                     ? ::posix_spawnp(&pid, argv[0].c_str(), &actions, &attr, args.data(), environ)
                     : ::posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  METRALE_CHECK(rc == 0, "cannot run '", argv[0], "': ", std::strerror(rc));
  out.write.reset();
  err.write.reset();

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options.timeout_s));
  ProcessResult result;
  auto kill_child = [&] {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  };
  char buf[65536];
  while (out.read.fd >= 0 || err.read.fd >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      kill_child();
      throw make_error("'", argv[0], "' timed out after ", options.timeout_s,
                       " s and was killed; stderr: ", tail(result.err));
    }
    pollfd fds[2] = {{out.read.fd, POLLIN, 0}, {err.read.fd, POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) {
      kill_child();
      throw make_error("poll failed while running '", argv[0], "': ", std::strerror(errno));
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        (i == 0 ? out : err).read.reset();
        continue;
      }
      if (i == 0) {
        if (result.out.size() + size_t(n) > options.max_stdout_bytes) {
          kill_child();
          throw make_error("'", argv[0], "' produced more than ", options.max_stdout_bytes,
                           " bytes of output and was killed");
        }
        result.out.insert(result.out.end(), buf, buf + n);
      } else {
        result.err.append(buf, size_t(n));
        if (result.err.size() > 2 * options.max_stderr_bytes) {
          result.err.erase(0, result.err.size() - options.max_stderr_bytes);
        }
      }
    }
  }
  // Pipes closed: the child is exiting; still bound the wait by the deadline.
  int status = 0;
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) throw make_error("waitpid failed: ", std::strerror(errno));
    if (Clock::now() >= deadline) {
      kill_child();
      throw make_error("'", argv[0], "' timed out after ", options.timeout_s,
                       " s and was killed; stderr: ", tail(result.err));
    }
    ::usleep(2000);
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

FfmpegProbe resolve_ffmpeg() {
  FfmpegProbe p;
  const char* env = std::getenv("METRALE_FFMPEG");
  std::string choice = env != nullptr ? env : "";
  if (choice == "0") {
    p.state = FfmpegState::kDisabled;
    p.detail = "disabled by METRALE_FFMPEG=0";
    return p;
  }
  if (choice.empty()) {
    p.ffmpeg = find_on_path("ffmpeg");
    if (p.ffmpeg.empty()) {
      p.detail = "no 'ffmpeg' on PATH (install ffmpeg, or set METRALE_FFMPEG=/path/to/ffmpeg)";
      return p;
    }
  } else {
    p.ffmpeg = choice;
    if (!file_executable(choice)) {
      p.detail = "METRALE_FFMPEG=" + choice + " is not an executable file";
      return p;
    }
  }
  const char* probe_env = std::getenv("METRALE_FFPROBE");
  if (probe_env != nullptr && *probe_env != '\0') {
    p.ffprobe = probe_env;
  } else {
    const size_t slash = p.ffmpeg.rfind('/');
    std::string sibling = p.ffmpeg.substr(0, slash + 1) + "ffprobe";
    p.ffprobe =
        file_executable(sibling) ? sibling : (choice.empty() ? find_on_path("ffprobe") : "");
  }
  p.state = FfmpegState::kReady;
  return p;
}

FfmpegProbe ffmpeg_probe(double timeout_s) {
  FfmpegProbe p = resolve_ffmpeg();
  if (p.state != FfmpegState::kReady) return p;
  p.state = FfmpegState::kMissing;
  try {
    ProcessResult r = run_process({p.ffmpeg, "-hide_banner", "-version"},
                                  {.timeout_s = timeout_s, .max_stdout_bytes = 1 << 20});
    if (r.exit_code != 0) {
      p.detail = metrale::detail::concat("'", p.ffmpeg, " -version' exited with ", r.exit_code,
                                         ": ", tail(r.err, 500));
      return p;
    }
    std::string out(r.out.begin(), r.out.end());
    p.detail = out.substr(0, out.find('\n'));
    p.state = FfmpegState::kReady;
  } catch (const Error& e) {
    p.detail = e.message();
  }
  return p;
}

}  // namespace metrale::vision
