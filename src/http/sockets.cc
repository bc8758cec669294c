#include "http/sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cstdlib>
#include <string>

namespace metrale::http {
namespace {

// The address and port of a socket end, printed as httplib prints req.remote_addr.
bool socket_end(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  std::array<char, NI_MAXHOST> host{};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host.data(), host.size(), nullptr,
                  0, NI_NUMERICHOST) != 0) {
    return false;
  }
  ip = host.data();
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  return true;
}

// Calls fn(fd) for each socket of this process (from /proc/self/fd, Linux) until it returns
// true; returns that fd, or -1.
template <typename F>
int find_socket(F&& fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    if (fn(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

int find_connection_socket(int local_port, std::string_view remote_addr, int remote_port) {
  return find_socket([&](int fd) {
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      return false;  // not a socket, or not a connected one
    }
    std::string local_ip, peer_ip;
    int found_local_port = -1, peer_port = -1;
    return socket_end(local, local_len, local_ip, found_local_port) &&
           socket_end(peer, peer_len, peer_ip, peer_port) && found_local_port == local_port &&
           peer_port == remote_port && peer_ip == remote_addr;
  });
}

void raise_listen_backlog(int port) {
  find_socket([&](int fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    sockaddr_storage local{};
    socklen_t local_len = sizeof local;
    std::string ip;
    int local_port = -1;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        !socket_end(local, local_len, ip, local_port) || local_port != port) {
      return false;
    }
    ::listen(fd, SOMAXCONN);
    return true;
  });
}

bool peer_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace metrale::http
