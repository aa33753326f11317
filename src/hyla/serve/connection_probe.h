#pragma once
// Tells whether an HTTP client is still connected while its request waits for the engine.
// cpp-httplib 0.11 does not hand the connection to request handlers, so the probe finds the
// socket whose addresses match the request's (local port, remote address and port) and peeks it:
// a peer that closed reads as end-of-file.
#include <string>

namespace hyla {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;  // probes nothing: never closed
  ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port);
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace hyla
