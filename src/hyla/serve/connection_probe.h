#pragma once
// What the server needs to know of an HTTP client's connection that cpp-httplib 0.11 does not tell
// request handlers: whether the client is still there while its request waits for the engine, and
// whether it has half-closed (shutdown(SHUT_WR) after its request, as `nc -N` and some HTTP/1.0
// tools do). The probe finds the socket whose addresses match the request's (local port, remote
// address and port).
//
// End-of-file alone does not mean the client is gone: a closed socket and a half-closed one look
// the same until something is written to them. Once the probe sees end-of-file it writes an interim
// `100 Continue`, which HTTP/1.1 clients must accept before the final response (RFC 9110 §15.2): a
// half-closed peer takes it, a closed one answers with a reset, and only a reset or an error counts
// as gone. The interim write is allowed only before a response starts (non-streaming requests of
// HTTP/1.1 clients); closed() and the final response are never concurrent, because the engine
// polls closed() only before it finishes a request.
//
// cpp-httplib 0.11 refuses to write to a socket whose peer has half-closed (its writability check
// reads end-of-file as a dead peer), so the server sends such a client its reply through
// send_reply(). Streams and cpp-httplib's own rejections still cannot reach a half-closed client.
#include <string>
#include <string_view>

namespace hyla {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;  // probes nothing: never closed
  ConnectionProbe(const std::string& remote_addr, int remote_port, int local_port);
  void allow_interim(bool allowed) { may_write_interim_ = allowed; }
  bool closed();            // reset, error, or (HTTP/1.1) end-of-file and the interim write failed
  bool half_closed() const; // end-of-file is the next thing to read, and the peer still takes data
  // Writes a whole response (Connection: close); false if the peer does not take it.
  bool send_reply(int status, std::string_view content_type, std::string_view body) const;

 private:
  int fd_ = -1;
  bool may_write_interim_ = false, wrote_interim_ = false;
};

}  // namespace hyla
