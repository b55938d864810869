// urnicctl: talks to a running urnicd over its control socket.
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dataplane/hostif/ctl_proto.h"

namespace ctl = urnic::ctl;

namespace {

void usage(FILE* f) {
  fprintf(
      f,
      "usage: urnicctl [-s SOCKET] COMMAND\n"
      "  stats [--json]   counters of the running service (rates since "
      "the last query)\n"
      "  ping IPV4        make the service send one ICMP echo request\n"
      "  gids             the port's GID table (index, GID, type)\n"
      "  objects          verbs objects of the device and of each client\n"
      "  qps [--json]     per-QP counters (retransmits, NAKs by type, ...)\n"
      "                   and per-lcore busy/idle cycles and doorbells;\n"
      "                   --json prints one JSON object per page of QPs\n"
      "  fault [KEY=VALUE...]  fault injection on the port: the settings,\n"
      "                   or change them (keys of the config's fault\n"
      "                   section, e.g. tx.drop_ppm=10000 rx.delay_us=100;\n"
      "                   all zero: off)\n"
      "  version          service and protocol version\n"
      "SOCKET defaults to $URNIC_SOCKET, else /run/urnic/urnicd.sock\n"
      "Exit status: 0 done; 1 the service is not there, failed or refused\n"
      "(its reason on stderr); 2 a usage error (nothing sent)\n");
}

// Sends one request; prints the reply payload. Returns the exit code.
int call(const std::string& path, ctl::Op op, const std::string& body,
         std::string& out) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof sa.sun_path) {
    fprintf(stderr, "urnicctl: bad socket path %s\n", path.c_str());
    return 1;
  }
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    const int e = errno;
    // Only "nothing there" and "nobody listening" mean it is not running.
    if (e == ENOENT || e == ECONNREFUSED)
      fprintf(stderr, "urnicctl: urnicd is not running at %s: %s\n",
              path.c_str(), strerror(e));
    else if (e == EACCES || e == EPERM)
      fprintf(stderr,
              "urnicctl: %s: %s (the socket's owner, group and mode: "
              "urnicd's control.* settings)\n",
              path.c_str(), strerror(e));
    else
      fprintf(stderr, "urnicctl: %s: %s (not urnicd's socket?)\n", path.c_str(),
              strerror(e));
    close(fd);
    return 1;
  }
  ctl::Hdr h;
  h.op = static_cast<uint16_t>(op);
  h.len = static_cast<uint32_t>(body.size());
  std::string msg(reinterpret_cast<const char*>(&h), sizeof h);
  msg += body;
  if (send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) < 0) {
    fprintf(stderr, "urnicctl: send: %s\n", strerror(errno));
    close(fd);
    return 1;
  }
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 5000) != 1) {
    fprintf(stderr, "urnicctl: no answer from %s within 5 s\n", path.c_str());
    close(fd);
    return 1;
  }
  static char buf[ctl::kMaxMsg];
  const ssize_t n = recv(fd, buf, sizeof buf, 0);
  close(fd);
  ctl::Hdr r;
  if (n < static_cast<ssize_t>(sizeof r)) {
    fprintf(stderr, "urnicctl: connection closed by urnicd\n");
    return 1;
  }
  std::memcpy(&r, buf, sizeof r);
  if (r.magic != ctl::kMagic || r.len != n - sizeof r) {
    fprintf(stderr, "urnicctl: malformed reply\n");
    return 1;
  }
  out.assign(buf + sizeof r, r.len);
  if (r.status != 0) {
    fprintf(stderr, "urnicctl: %s (%s)\n", out.c_str(), strerror(-r.status));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = getenv("URNIC_SOCKET");
  std::string path = env && *env ? env : "/run/urnic/urnicd.sock";
  int i = 1;
  if (i + 1 < argc && std::strcmp(argv[i], "-s") == 0) {
    path = argv[i + 1];
    i += 2;
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[i++];
  std::string out;
  int rc;
  if (cmd == "stats") {
    const bool json = i < argc && std::strcmp(argv[i], "--json") == 0;
    if (json) ++i;
    if (i != argc) {
      usage(stderr);
      return 2;
    }
    rc = call(path, json ? ctl::Op::kStatsJson : ctl::Op::kStatsText, "", out);
  } else if (cmd == "qps") {
    const bool json = i < argc && std::strcmp(argv[i], "--json") == 0;
    if (json) ++i;
    if (i != argc) {
      usage(stderr);
      return 2;
    }
    // Pages of QPs: the reply names the QPN the next page starts at.
    std::string from;
    for (bool first = true;; first = false) {
      std::string page;
      rc = call(path, json ? ctl::Op::kQpStats : ctl::Op::kQpStatsText, from,
                page);
      if (rc != 0) break;
      std::string next;
      if (json) {
        const size_t k = page.rfind("\"next\":");
        if (k != std::string::npos) next = std::to_string(atol(&page[k + 7]));
        if (next == "0") next.clear();
      } else {
        const size_t k = page.rfind("next ");
        if (k != std::string::npos && (k == 0 || page[k - 1] == '\n')) {
          next = std::to_string(atol(&page[k + 5]));
          page.resize(k);
        }
        // Later pages: only the QP rows (no lcore lines, no header).
        if (!first) page.erase(0, page.find('\n', page.find("qpn")) + 1);
      }
      out += page;
      // Pages go up in QPN: a reply that does not is malformed (and would
      // loop for ever).
      if (next.empty() ||
          (!from.empty() && atol(next.c_str()) <= atol(from.c_str())))
        break;
      from = next;
    }
  } else if (cmd == "ping" && i + 1 == argc) {
    // A typo is a usage error here, not "urnicd is not running" or a
    // round trip to the service. The service's check is the same call
    // (config::parse_ipv4; urnicctl does not link the config library).
    in_addr a;
    if (inet_pton(AF_INET, argv[i], &a) != 1) {
      fprintf(stderr, "urnicctl: ping: '%s' is not an IPv4 address\n", argv[i]);
      return 2;
    }
    rc = call(path, ctl::Op::kPing, argv[i], out);
    if (rc == 0) out += "\n";
  } else if (cmd == "gids" && i == argc) {
    rc = call(path, ctl::Op::kGids, "", out);
  } else if (cmd == "objects" && i == argc) {
    rc = call(path, ctl::Op::kObjects, "", out);
  } else if (cmd == "fault") {
    // The form is checked here; keys and values by the service (its
    // config parser, against the settings in effect). The service splits
    // the body at any whitespace, so an argument holding some would be
    // taken as two.
    std::string body;
    for (; i < argc; ++i) {
      const char* eq = std::strchr(argv[i], '=');
      if (!eq || eq == argv[i] || std::strpbrk(argv[i], " \t\n\v\f\r")) {
        fprintf(stderr,
                "urnicctl: fault: '%s' is not KEY=VALUE (one per argument)\n",
                argv[i]);
        return 2;
      }
      body += std::string(body.empty() ? "" : " ") + argv[i];
    }
    rc = call(path, ctl::Op::kFault, body, out);
  } else if (cmd == "version" && i == argc) {
    rc = call(path, ctl::Op::kHello, "", out);
    if (rc == 0) out += "\n";
  } else if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    return 0;
  } else {
    usage(stderr);
    return 2;
  }
  if (rc == 0 && (fputs(out.c_str(), stdout) < 0 || fflush(stdout) != 0)) {
    fprintf(stderr, "urnicctl: stdout: %s\n", strerror(errno));
    return 1;
  }
  return rc;
}
