// The control socket (Unix SEQPACKET): accepts clients, reads one request
// message at a time and answers it. Runs on the main lcore only.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/hostif/ctl_proto.h"

namespace urnic::service {

// Who is on the other end of a connection (SO_PEERCRED at accept).
struct ClientInfo {
  uint64_t id = 0;  // unique for the service's lifetime
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct CtlRequest {
  const ClientInfo* client = nullptr;
  ctl::Op op{};
  std::string_view body;
  std::vector<int>& fds;  // passed with SCM_RIGHTS; the handler closes or
                          // keeps them (the server closes what is left)
  // A request the handler deferred (CtlReply::later) comes again: the
  // how-many-th time (0: first), and when it first arrived (CLOCK_MONOTONIC).
  uint32_t attempt = 0;
  uint64_t since_ns = 0;
};

struct CtlReply {
  int status = 0;  // 0 or -errno (payload then holds a message)
  std::string payload;
  std::vector<int> fds;  // sent with the reply, then closed here
  // Not answered yet (e.g. a neighbour still resolving): the server gives
  // the same request (and its fds, untouched) to the handler again in a few
  // milliseconds, serving the other clients meanwhile; this client's later
  // requests wait, so its requests stay in order.
  bool later = false;
};

class ControlServer {
 public:
  using Handler = std::function<void(CtlRequest&, CtlReply&)>;
  // A connection closed (clean exit, crash, kill -9): release its objects.
  using CloseHandler = std::function<void(const ClientInfo&)>;

  // Creates the socket's directory if needed, refuses to start if another
  // service answers on the path, removes a stale socket file. Throws.
  ControlServer(const config::ControlConfig& cfg, Handler h,
                CloseHandler on_close = nullptr);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Throws if a live service already answers on `path`, or the path holds
  // anything but a dead service's socket (checked before EAL start-up so a
  // second instance fails fast and touches no port).
  static void ensure_free(const std::string& path);
  // The users and groups the config names (allow lists, owner, group),
  // looked up; throws naming the key of one this host does not know.
  // Before EAL start-up too: a typo fails before the port is touched.
  struct Ids {
    std::set<uid_t> allow_uids;
    std::set<gid_t> allow_gids;
    uid_t owner = static_cast<uid_t>(-1);  // -1: unchanged
    gid_t group = static_cast<gid_t>(-1);
  };
  static Ids resolve_ids(const config::ControlConfig& cfg);

  // Waits up to timeout_ms for activity, serves it.
  void poll(int timeout_ms);
  const std::string& path() const { return path_; }
  // Connections refused (control.allow_*, the socket's mode, too many).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  struct Client {
    int fd = -1;
    ClientInfo info;
    // A deferred request (CtlReply::later): its bytes and fds.
    bool pending = false;
    std::string req;
    std::vector<int> req_fds;
    uint32_t attempts = 0;
    uint64_t since_ns = 0;
    bool truncated = false;  // the message or its fds did not fit
  };
  // False when the connection is finished.
  bool serve(Client& c);
  // Runs the handler on c's request (c.req, c.req_fds); replies unless it
  // is deferred again.
  void process(Client& c);
  static void drop_pending(Client& c);
  // Whether the peer of `fd` (credentials `ci`) may use the service.
  bool permitted(int fd, const ClientInfo& ci) const;
  std::string path_;
  uint32_t mode_ = 0;
  std::set<uid_t> allow_uids_;  // control.allow_users, resolved
  std::set<gid_t> allow_gids_;  // control.allow_groups, resolved
  std::atomic<uint64_t> refused_{0};
  int listen_fd_ = -1;
  uint64_t next_id_ = 1;
  std::vector<Client> clients_;
  Handler handler_;
  CloseHandler on_close_;
};

}  // namespace urnic::service
