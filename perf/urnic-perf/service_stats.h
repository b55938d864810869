// urnicd's own counters for the QPs of a run (control op kQpStats): what
// the service saw of them (retransmits, NAKs by type, ...) and how busy its
// lcores were. Optional: without a socket, or against another verbs
// device, the harness shows "-".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

namespace urnic::perf {

struct ServiceSample {
  bool ok = false;
  uint64_t time_ns = 0;
  uint64_t tsc_hz = 0;
  // Summed over the run's QPs, by counter name (qp_fields minus qpn/pid/
  // lcore), and per QPN.
  std::map<std::string, uint64_t> sum;
  std::map<uint32_t, std::map<std::string, uint64_t>> per_qp;
  struct Lcore {
    uint32_t lcore = 0;
    uint32_t qps = 0;  // QPs homed on it
    uint64_t cycles_busy = 0, cycles_idle = 0, doorbells = 0, shim_wqes = 0;
  };
  std::vector<Lcore> lcores;
};

class ServiceStats {
 public:
  explicit ServiceStats(std::string socket) : socket_(std::move(socket)) {}
  bool enabled() const { return !socket_.empty(); }
  // Reads every page; only QPNs in `qpns` are kept. On failure returns a
  // sample with ok = false and sets error() (printed once by the caller).
  ServiceSample sample(const std::unordered_set<uint32_t>& qpns);
  const std::string& error() const { return err_; }

 private:
  bool call(uint32_t from, std::string& out);
  std::string socket_;
  std::string err_;
};

}  // namespace urnic::perf
