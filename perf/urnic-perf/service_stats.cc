#include "perf/urnic-perf/service_stats.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "dataplane/hostif/ctl_proto.h"

namespace urnic::perf {

bool ServiceStats::call(uint32_t from, std::string& out) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (fd < 0 || socket_.size() >= sizeof sa.sun_path) {
    err_ = "bad socket path " + socket_;
    if (fd >= 0) close(fd);
    return false;
  }
  std::memcpy(sa.sun_path, socket_.c_str(), socket_.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    err_ = "urnicd not answering at " + socket_ + " (" + strerror(errno) + ")";
    close(fd);
    return false;
  }
  const std::string body = from ? std::to_string(from) : std::string();
  ctl::Hdr h;
  h.op = static_cast<uint16_t>(ctl::Op::kQpStats);
  h.len = static_cast<uint32_t>(body.size());
  std::string msg(reinterpret_cast<const char*>(&h), sizeof h);
  msg += body;
  auto buf = std::make_unique<char[]>(ctl::kMaxMsg);
  pollfd p{fd, POLLIN, 0};
  ssize_t n = -1;
  if (send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(msg.size()) &&
      poll(&p, 1, 2000) == 1)
    n = recv(fd, buf.get(), ctl::kMaxMsg, 0);
  close(fd);
  ctl::Hdr r;
  if (n < static_cast<ssize_t>(sizeof r)) {
    err_ = "no answer from urnicd at " + socket_;
    return false;
  }
  std::memcpy(&r, buf.get(), sizeof r);
  out.assign(buf.get() + sizeof r, static_cast<size_t>(n) - sizeof r);
  if (r.magic != ctl::kMagic || r.status != 0) {
    err_ = "urnicd at " + socket_ + " has no per-QP counters (" + out + ")";
    return false;
  }
  return true;
}

ServiceSample ServiceStats::sample(const std::unordered_set<uint32_t>& qpns) {
  ServiceSample s;
  uint32_t from = 0;
  try {
    for (int page = 0; page < 4096; ++page) {
      std::string out;
      if (!call(from, out)) return s;
      const YAML::Node j = YAML::Load(out);  // JSON is YAML
      if (page == 0) {
        s.time_ns = j["time_ns"].as<uint64_t>();
        s.tsc_hz = j["tsc_hz"].as<uint64_t>();
        for (const YAML::Node& l : j["lcores"]) {
          ServiceSample::Lcore x;
          x.lcore = l["lcore"].as<uint32_t>();
          x.qps = l["qps"].as<uint32_t>();
          x.cycles_busy = l["cycles_busy"].as<uint64_t>();
          x.cycles_idle = l["cycles_idle"].as<uint64_t>();
          x.doorbells = l["doorbells"].as<uint64_t>();
          x.shim_wqes = l["shim_wqes"].as<uint64_t>();
          s.lcores.push_back(x);
        }
      }
      const YAML::Node f = j["qp_fields"];
      std::vector<std::string> names;
      for (const YAML::Node& n : f) names.push_back(n.as<std::string>());
      for (const YAML::Node& row : j["qps"]) {
        std::map<std::string, uint64_t> v;
        for (size_t i = 0; i < names.size() && i < row.size(); ++i)
          v[names[i]] = row[i].as<uint64_t>();
        const auto qpn = static_cast<uint32_t>(v["qpn"]);
        if (!qpns.count(qpn)) continue;
        for (const auto& [k, x] : v)
          if (k != "qpn" && k != "pid" && k != "lcore") s.sum[k] += x;
        s.per_qp[qpn] = std::move(v);
      }
      from = j["next"].as<uint32_t>();
      if (!from) break;
    }
  } catch (const YAML::Exception& e) {
    err_ = std::string("urnicd counters unreadable: ") + e.what();
    return s;
  }
  s.ok = true;
  return s;
}

}  // namespace urnic::perf
