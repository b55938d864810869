// urnicd's main lcore, the control side: builds the parts the config asks
// for (port, neighbour cache, device, worker lcores, the shim's and the RDMA
// CM's servers, the control socket), runs the control loop until g_quit,
// and tears them down in the one order that is safe on every path (lcores
// stop, clients are told and disconnected, then objects, workers and the
// port go). main.cc parses the command line and initialises EAL; the
// control socket's own operations (stats, qps, gids, fault, ping) are in
// daemon_ops.cc. Nothing here runs on a worker lcore.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/urnic_config.h"
#include "dataplane/host/host.h"
#include "dataplane/service/cm_server.h"
#include "dataplane/service/control.h"
#include "dataplane/service/service.h"
#include "dataplane/service/shim_server.h"
#include "dataplane/stats/report.h"
#include "dataplane/transport/engine.h"

namespace urnic::service {

class Daemon {
 public:
  explicit Daemon(const config::Config& cfg) : cfg_(cfg) {}
  ~Daemon() { teardown(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Builds everything and launches the worker lcores; throws (with what
  // failed) and leaves the rest to the destructor.
  void start();
  // The control loop: the socket, async events, CM MADs, finished worker
  // commands, link changes, periodic stats. Returns once g_quit is set.
  void serve();
  // After serve(): lcores stopped, clients told (IBV_EVENT_DEVICE_FATAL),
  // the final stats printed, everything torn down.
  void stop();
  void join_workers();  // g_quit set: wakes the workers, waits for them
  // Idempotent; safe after a start() that threw part-way.
  void teardown();

 private:
  // daemon.cc: the parts
  void start_workers();
  ShimEnv shim_env();
  CmEnv cm_env();
  void mcast_changed(const uint8_t gid[16], bool joined);
  void leave_groups();
  int warm_neighbour(const uint8_t dgid[16], uint32_t attempt,
                     uint64_t since_ns);
  int cm_neighbour(const uint8_t dgid[16]);
  bool cm_send_frame(const uint8_t dgid[16], const uint8_t* frame,
                     uint32_t len);
  // Hands `c` to worker 0 (and keeps it until the worker is done with it).
  bool post(std::unique_ptr<Command> c);
  void poll_gsi();
  void check_link();
  std::string zero_copy_setup();  // sets zero_copy_ if on; says why if not

  // daemon_ops.cc: the control socket's own operations
  void handle(CtlRequest& req, CtlReply& rep);
  std::string op(ctl::Op op, std::string_view body, int& status);
  std::string qp_stats(ctl::Op op, std::string_view body, int& status);
  std::string ping(std::string_view body, int& status);
  std::string fault(std::string_view body, int& status);
  stats::Snapshot snapshot();

  const config::Config& cfg_;
  // Declared before the workers (destroyed after them), so that a worker
  // lcore never sees them go away while it still runs.
  PortInfo port_;
  host::HostAddrs addrs_;
  std::unique_ptr<host::NeighbourTable> neigh_;
  std::unique_ptr<transport::Resolver> resolver_;
  transport::DeviceConfig dc_;
  std::unique_ptr<transport::Device> device_;
  std::deque<std::unique_ptr<Command>> commands_;  // posted, not yet done
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker*> peers_;  // workers by home index
  std::unique_ptr<ZeroCopyTx> zero_copy_;
  std::string zero_copy_state_;
  uint64_t ring_drops_ = 0;  // af_packet kernel ring drops so far (RX-missed)
  std::unique_ptr<ShimServer> shim_;
  std::unique_ptr<CmServer> cm_;
  rte_ring* gsi_ = nullptr;  // QP1 frames, workers -> control thread
  // After shim_: closing a connection releases that client's objects in
  // the shim, so the connections must close first.
  std::unique_ptr<ControlServer> ctl_;

  config::FaultConfig fault_;  // in effect (urnicctl fault changes it)
  // CM address resolutions asked of worker 0 lately, by GID.
  std::map<std::array<uint8_t, 16>, uint64_t> cm_asked_;
  uint64_t t0_ = 0;
  stats::Snapshot last_query_, last_print_;
  bool link_up_ = false;
  bool lcores_stopped_ = false;  // leave_groups ran: no IGMP frame is posted
  uint64_t next_link_check_ = 0, next_print_ = 0;
};

// The attributes ibv_query_device / ibv_query_port report: the service's
// configured limits, as they are.
shim::OpenRep shim_info(const transport::DeviceConfig& dc);
// "fault.key=value" lines, the whole fault section.
std::string fault_text(const config::FaultConfig& f);
// fault.seed 0 (in the config or by urnicctl): a random seed, never 0.
uint64_t random_fault_seed();

}  // namespace urnic::service
