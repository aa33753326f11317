#include "hyla/serve/connection_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <filesystem>
#include <string_view>

namespace hyla {

namespace {

// The port and textual address of a socket address (IPv4 or IPv6).
bool describe(const sockaddr_storage& a, std::string& addr, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  addr = text;
  return true;
}

}  // namespace

ConnectionProbe::ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    std::string local_addr, peer_addr;
    int lport = -1, pport = -1;
    if (!describe(local, local_addr, lport) || !describe(peer, peer_addr, pport)) continue;
    if (lport == local_port && pport == remote_port && peer_addr == remote_addr) {
      fd_ = fd;
      return;
    }
  }
}

namespace {

// The peer's state as far as reading tells: reset or error, end-of-file next, or data/nothing yet.
enum class PeerState { gone, end_of_file, open };

PeerState peer_state(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) < 0) return PeerState::open;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return PeerState::gone;  // reset, or both directions shut
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return PeerState::end_of_file;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return PeerState::gone;
  return PeerState::open;  // a pipelined request, or nothing sent
}

// The statuses the server's handlers answer with.
const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "";  // optional (RFC 9112 §4): clients read the code
  }
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(size_t(n));
  }
  return true;
}

}  // namespace

bool ConnectionProbe::closed() {
  if (fd_ < 0) return false;
  const PeerState state = peer_state(fd_);
  if (state != PeerState::end_of_file) return state == PeerState::gone;
  if (!may_write_interim_ || wrote_interim_) return false;  // no telling, or known to be half-closed
  wrote_interim_ = true;
  static constexpr std::string_view kInterim = "HTTP/1.1 100 Continue\r\n\r\n";
  return send(fd_, kInterim.data(), kInterim.size(), MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
}

bool ConnectionProbe::half_closed() const { return fd_ >= 0 && peer_state(fd_) == PeerState::end_of_file; }

bool ConnectionProbe::send_reply(int status, std::string_view content_type, std::string_view body) const {
  if (fd_ < 0) return false;
  const std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\nContent-Type: " + std::string(content_type) +
                           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  return send_all(fd_, head) && send_all(fd_, body);
}

}  // namespace hyla
