#pragma once
// The server's few direct socket calls (Linux): finding a connection's socket among the
// process's descriptors, noticing a peer that went away, and raising the listen backlog.
#include <string_view>

namespace metrale::http {

// The socket of the connection a handler serves. cpp-httplib 0.11 gives a handler no access
// to it (Request carries only the two ends' addresses, and the only hook on accepted sockets
// is a private virtual), yet a non-streaming request must notice a client that hung up while
// it waited, or a dead client's sequence would decode to max_tokens. A TCP connection is the
// one socket of this process with its (local port, peer address, peer port), so the handler
// finds it among /proc/self/fd (microseconds for the few hundred descriptors a server holds),
// once per request. The connection thread owns the socket until the handler returns, so the
// descriptor cannot be closed or reused meanwhile. -1 when not found (the request is then
// only bounded by its timeout).
int find_connection_socket(int local_port, std::string_view remote_addr, int remote_port);

// Whether the peer closed or reset the connection: HTTP clients do not half-close while
// awaiting a response, so a FIN (POLLRDHUP) means it went away. False for fd < 0.
bool peer_gone(int fd);

// Debian's libcpp-httplib 0.11 is built with a listen backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG
// is compiled into the library, so defining it here changes nothing): 32 clients connecting at
// once would see dropped SYNs and second-long retries. Linux lets listen() be called again on a
// listening socket to change its backlog, so the server finds its socket listening on `port`
// and raises it.
void raise_listen_backlog(int port);

}  // namespace metrale::http
