// The control socket's access policy (ControlServer): the socket file's
// owner and group, and control.allow_users / allow_groups checked against
// the peer's credentials. A client of another uid is a forked child that
// drops to "nobody" (the test needs root to do that; it skips otherwise).
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "dataplane/service/control.h"
#include "gtest/gtest.h"

namespace urnic::service {
namespace {

struct Ids {
  uid_t nobody_uid;
  gid_t nobody_gid;
  std::string nobody_group;
};

bool lookup(Ids* out) {
  const passwd* pw = getpwnam("nobody");
  if (!pw) return false;
  const group* gr = getgrgid(pw->pw_gid);
  if (!gr) return false;
  *out = {pw->pw_uid, pw->pw_gid, gr->gr_name};
  return true;
}

class ControlAccess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
    if (!lookup(&ids_)) GTEST_SKIP() << "no user nobody";
    char dir[] = "/tmp/urnic-ctl.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    chmod(dir_.c_str(), 0755);  // "nobody" must reach the socket
    cfg_.socket = dir_ + "/s.sock";
    cfg_.mode = 0666;  // the file mode lets everyone connect
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty()) rmdir(dir_.c_str());
  }

  void start() {
    server_ = std::make_unique<ControlServer>(
        cfg_, [](CtlRequest&, CtlReply& out) { out.payload = "served"; });
  }

  // One request from a child running as nobody; the reply's status and
  // payload, or status 1 if nothing came back.
  std::pair<int, std::string> ask_as_nobody() {
    int pfd[2];
    if (pipe(pfd) != 0) return {1, "pipe"};
    const pid_t pid = fork();
    if (pid == 0) {
      close(pfd[0]);
      if (setgroups(0, nullptr) != 0 || setgid(ids_.nobody_gid) != 0 ||
          setuid(ids_.nobody_uid) != 0)
        _exit(2);
      const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      sockaddr_un sa{};
      sa.sun_family = AF_UNIX;
      std::strncpy(sa.sun_path, cfg_.socket.c_str(), sizeof sa.sun_path - 1);
      if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
        _exit(3);
      ctl::Hdr req;
      req.op = static_cast<uint16_t>(ctl::Op::kQpStats);
      // A refused client finds the answer already queued and the socket
      // closed: the send may fail (EPIPE), the reply is still there.
      (void)!send(fd, &req, sizeof req, MSG_NOSIGNAL);
      char buf[1024];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n > 0 && write(pfd[1], buf, static_cast<size_t>(n)) != n) _exit(5);
      _exit(0);
    }
    close(pfd[1]);
    // Serve while the child talks; stop when it has exited.
    int status = 0;
    for (int i = 0; i < 500; ++i) {
      server_->poll(10);
      if (waitpid(pid, &status, WNOHANG) == pid) break;
    }
    char buf[1024];
    const ssize_t n = read(pfd[0], buf, sizeof buf);
    close(pfd[0]);
    if (n < static_cast<ssize_t>(sizeof(ctl::Hdr))) return {1, "no reply"};
    ctl::Hdr rep;
    std::memcpy(&rep, buf, sizeof rep);
    return {rep.status, std::string(buf + sizeof rep, n - sizeof rep)};
  }

  Ids ids_{};
  std::string dir_;
  config::ControlConfig cfg_;
  std::unique_ptr<ControlServer> server_;
};

TEST_F(ControlAccess, WithoutAllowListsTheModeDecides) {
  start();
  const auto [status, text] = ask_as_nobody();
  EXPECT_EQ(status, 0) << text;
  EXPECT_EQ(text, "served");
  EXPECT_EQ(server_->refused(), 0u);
}

TEST_F(ControlAccess, AllowUsersAdmitsTheListedAndRefusesOthers) {
  cfg_.allow_users = {"nobody"};
  start();
  EXPECT_EQ(ask_as_nobody().first, 0);
  server_.reset();
  cfg_.allow_users = {"daemon", "0"};  // a name and a number
  start();
  const auto [status, text] = ask_as_nobody();
  EXPECT_EQ(status, -EACCES);
  EXPECT_NE(text.find("may not use this urnicd"), std::string::npos) << text;
  EXPECT_NE(text.find("control.allow_users"), std::string::npos) << text;
  EXPECT_NE(text.find("(nobody)"), std::string::npos) << text;
  EXPECT_EQ(server_->refused(), 1u);
}

TEST_F(ControlAccess, AllowGroupsAdmitsMembers) {
  cfg_.allow_groups = {ids_.nobody_group};
  start();
  EXPECT_EQ(ask_as_nobody().first, 0);
  server_.reset();
  cfg_.allow_groups = {"root"};
  start();
  EXPECT_EQ(ask_as_nobody().first, -EACCES);
}

TEST_F(ControlAccess, OwnerAndGroupOfTheSocketFile) {
  cfg_.owner = "nobody";
  cfg_.group = std::to_string(ids_.nobody_gid);
  cfg_.mode = 0600;
  start();
  struct stat st {};
  ASSERT_EQ(stat(cfg_.socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ids_.nobody_uid);
  EXPECT_EQ(st.st_gid, ids_.nobody_gid);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// control.socket naming a file that is not a dead urnicd's socket: refused,
// and the file is left as it was (urnicd runs as root; a typo must not
// delete /etc/passwd). A dead service's socket is taken over.
TEST_F(ControlAccess, TheSocketPathIsRemovedOnlyIfADeadServicesSocket) {
  // A regular file.
  {
    FILE* f = std::fopen(cfg_.socket.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("precious\n", f);
    std::fclose(f);
  }
  EXPECT_THROW(ControlServer::ensure_free(cfg_.socket), std::runtime_error);
  EXPECT_THROW(start(), std::runtime_error);
  struct stat st {};
  ASSERT_EQ(stat(cfg_.socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 9);
  unlink(cfg_.socket.c_str());
  // Another program's live stream socket: not urnicd's, not removed.
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strcpy(sa.sun_path, cfg_.socket.c_str());
  const int other = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(other, 1), 0);
  EXPECT_THROW(ControlServer::ensure_free(cfg_.socket), std::runtime_error);
  ASSERT_EQ(stat(cfg_.socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  close(other);
  // Its socket file, nobody listening: a dead service's; taken over.
  EXPECT_NO_THROW(ControlServer::ensure_free(cfg_.socket));
  EXPECT_NO_THROW(start());
}

TEST_F(ControlAccess, UnknownNamesAreRefusedAtStart) {
  cfg_.allow_users = {"no-such-user-urnic"};
  try {
    start();
    ADD_FAILURE() << "started with an unknown user";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "control.allow_users: no user \"no-such-user-urnic\""),
              std::string::npos)
        << e.what();
  }
  cfg_.allow_users.clear();
  cfg_.group = "no-such-group-urnic";
  EXPECT_THROW(start(), std::runtime_error);
  struct stat st {};
  EXPECT_NE(stat(cfg_.socket.c_str(), &st), 0);  // no socket left behind
}

}  // namespace
}  // namespace urnic::service

namespace urnic::service {
namespace {

// A request the handler defers (CtlReply::later, e.g. a neighbour still
// resolving) waits for its answer without holding the other clients: one
// client's create_ah to a silent peer held every client's verbs calls for
// 3 s while the control thread waited.
class ControlDefer : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/urnic-ctl.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    cfg_.socket = dir_ + "/s.sock";
  }
  void TearDown() override {
    for (int fd : fds_) close(fd);
    server_.reset();
    rmdir(dir_.c_str());
  }
  int connect_client() {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, cfg_.socket.c_str(), sizeof sa.sun_path - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    fds_.push_back(fd);
    server_->poll(10);  // accepts it
    return fd;
  }
  static void ask(int fd, ctl::Op op, uint8_t tag) {
    char buf[sizeof(ctl::Hdr) + 1];
    ctl::Hdr h;
    h.op = static_cast<uint16_t>(op);
    h.len = 1;
    std::memcpy(buf, &h, sizeof h);
    buf[sizeof h] = static_cast<char>(tag);
    ASSERT_EQ(send(fd, buf, sizeof buf, MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof buf));
  }
  // The reply's payload if one is there, else "".
  static std::string answer(int fd) {
    char buf[256];
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < static_cast<ssize_t>(sizeof(ctl::Hdr))) return "";
    return std::string(buf + sizeof(ctl::Hdr), n - sizeof(ctl::Hdr));
  }

  std::string dir_;
  config::ControlConfig cfg_;
  std::unique_ptr<ControlServer> server_;
  std::vector<int> fds_;
};

TEST_F(ControlDefer, ADeferredRequestWaitsWithoutHoldingOthers) {
  // Tag 'a' is deferred until its fourth attempt; the rest are answered at
  // once. The payload says which request and at which attempt.
  std::vector<uint64_t> since;
  server_ =
      std::make_unique<ControlServer>(cfg_, [&](CtlRequest& r, CtlReply& out) {
        const char tag = r.body.empty() ? '?' : r.body[0];
        if (tag == 'a') since.push_back(r.since_ns);
        if (tag == 'a' && r.attempt < 3) {
          out.later = true;
          return;
        }
        out.payload = std::string(1, tag) + std::to_string(r.attempt);
      });
  const int a = connect_client();
  const int b = connect_client();
  ask(a, ctl::Op::kQpStats, 'a');
  server_->poll(10);
  EXPECT_EQ(answer(a), "") << "deferred";
  // A's next request waits behind the deferred one (order per client).
  ask(a, ctl::Op::kQpStats, 'c');
  ask(b, ctl::Op::kQpStats, 'b');
  server_->poll(10);
  EXPECT_EQ(answer(b), "b0") << "B is served while A's request waits";
  EXPECT_EQ(answer(a), "");
  for (int i = 0; i < 10; ++i) server_->poll(10);
  EXPECT_EQ(answer(a), "a3");
  EXPECT_EQ(answer(a), "c0") << "then A's next request, in order";
  ASSERT_EQ(since.size(), 4u);
  EXPECT_EQ(since.front(), since.back()) << "the first arrival, every time";
}

TEST_F(ControlDefer, AClientThatLeavesWhileItsRequestWaitsIsClosed) {
  int closed = 0;
  server_ = std::make_unique<ControlServer>(
      cfg_, [](CtlRequest&, CtlReply& out) { out.later = true; },
      [&](const ClientInfo&) { ++closed; });
  const int a = connect_client();
  ask(a, ctl::Op::kQpStats, 'a');
  server_->poll(10);
  close(a);
  fds_.clear();
  for (int i = 0; i < 5 && !closed; ++i) server_->poll(10);
  EXPECT_EQ(closed, 1);
}

}  // namespace
}  // namespace urnic::service
