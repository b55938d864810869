// The control socket (Unix SEQPACKET): accepts clients, reads one request
// message at a time and answers it. Runs on the main lcore only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/service/ctl_proto.h"

namespace urnic::service {

class ControlServer {
 public:
  // Returns the reply payload; sets status to 0 or -errno.
  using Handler =
      std::function<std::string(ctl::Op, const std::string&, int& status)>;

  // Creates the socket's directory if needed, refuses to start if another
  // service answers on the path, removes a stale socket file. Throws.
  ControlServer(const config::ControlConfig& cfg, Handler h);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Throws if a live service already answers on `path` (checked before EAL
  // start-up so a second instance fails fast and touches no port).
  static void ensure_free(const std::string& path);

  // Waits up to timeout_ms for activity, serves it.
  void poll(int timeout_ms);
  const std::string& path() const { return path_; }

 private:
  void serve(int fd);
  std::string path_;
  int listen_fd_ = -1;
  std::vector<int> clients_;
  Handler handler_;
};

}  // namespace urnic::service
