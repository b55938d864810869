// urnicd: owns one Ethernet port through DPDK, runs the worker lcores, and
// serves the control socket and periodic stats from the main lcore.
#include <getopt.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <signal.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "dataplane/service/control.h"
#include "dataplane/service/daemon.h"
#include "dataplane/service/intr_thread.h"
#include "dataplane/service/service.h"

using namespace urnic;
using namespace urnic::service;

namespace {

void usage(FILE* f) {
  fprintf(f,
          "usage: urnicd [-c FILE] [-o key=value]... [--check-config] "
          "[--print-config]\n"
          "  -c FILE          configuration (default: the embedded demo "
          "config)\n"
          "  -o key=value     override one key, e.g. -o eal.file_prefix=x\n"
          "  --check-config   validate the configuration and exit\n"
          "  --print-config   print the effective configuration and exit\n");
}

void on_signal(int) {
  g_quit.store(true);
}

// A configuration EAL accepted but urnicd cannot run is refused here, before
// any port or lcore starts (a worker lcore that does not exist would never
// answer a park and would hang the control thread). Empty: fine.
std::string check_eal(const config::Config& cfg,
                      const std::vector<std::string>& args, int parsed) {
  // rte_eal_init stops at the first argument it does not take; what is
  // left was meant for EAL (a YAML list split where a quoted string was
  // meant, e.g. [--lcores=0@0,1@1]).
  if (static_cast<size_t>(parsed) + 1 < args.size())
    return "EAL did not take argument '" + args[parsed + 1] +
           "' (from eal.extra_args: quote an option whose value has commas, "
           "e.g. eal.extra_args=['--lcores=0@0,1@1'])";
  for (uint32_t w : cfg.eal.workers) {
    if (w == rte_get_main_lcore())
      return "worker lcore " + std::to_string(w) +
             " is the main lcore (eal.main_lcore)";
    if (w >= RTE_MAX_LCORE || !rte_lcore_is_enabled(w))
      return "worker lcore " + std::to_string(w) +
             " is not an EAL lcore (eal.workers lists lcores; an --lcores in "
             "eal.extra_args must define each of them)";
  }
  return {};
}

int run(const config::Config& cfg, char* prog) {
  std::vector<std::string> args = eal_args(cfg, prog);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int parsed = rte_eal_init(static_cast<int>(args.size()), argv.data());
  if (parsed < 0) {
    fprintf(stderr, "urnicd: EAL initialisation failed: %s\n",
            rte_strerror(rte_errno));
    return 1;
  }
  if (const std::string why = check_eal(cfg, args, parsed); !why.empty()) {
    fprintf(stderr, "urnicd: %s\n", why.c_str());
    intr_thread::eal_cleanup(2000);
    return 2;
  }
  int rc = 0;
  {
    Daemon d(cfg);  // its destructor tears down whatever start() built
    try {
      d.start();
      d.serve();
      d.stop();
      printf("urnicd: stopped\n");
    } catch (const std::exception& e) {
      fprintf(stderr, "urnicd: %s\n", e.what());
      rc = 1;
    }
  }
  intr_thread::eal_cleanup(2000);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  std::vector<std::string> overrides;
  bool check = false, print = false;
  static const option opts[] = {{"config", required_argument, nullptr, 'c'},
                                {"set", required_argument, nullptr, 'o'},
                                {"check-config", no_argument, nullptr, 'C'},
                                {"print-config", no_argument, nullptr, 'P'},
                                {"help", no_argument, nullptr, 'h'},
                                {nullptr, 0, nullptr, 0}};
  for (int ch; (ch = getopt_long(argc, argv, "c:o:h", opts, nullptr)) != -1;) {
    switch (ch) {
      case 'c':
        file = optarg;
        break;
      case 'o':
        overrides.push_back(optarg);
        break;
      case 'C':
        check = true;
        break;
      case 'P':
        print = true;
        break;
      case 'h':
        usage(stdout);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  config::Config cfg;
  try {
    cfg = file.empty() ? config::parse(config::embedded_default(), "<embedded>",
                                       overrides)
                       : config::load_file(file, overrides);
  } catch (const config::ConfigError& e) {
    fprintf(stderr, "urnicd: %s\n", e.what());
    return 2;
  }
  if (check) {
    printf("%s: OK\n", cfg.source.c_str());
    return 0;
  }
  if (print) {
    fputs(config::dump(cfg).c_str(), stdout);
    return 0;
  }
  if (const std::string why = check_cpus(cfg.eal); !why.empty()) {
    fprintf(stderr, "urnicd: %s\n", why.c_str());
    return 1;
  }
  try {
    ControlServer::resolve_ids(cfg.control);
    ControlServer::ensure_free(cfg.control.socket);
  } catch (const std::exception& e) {
    fprintf(stderr, "urnicd: %s\n", e.what());
    return 1;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return run(cfg, argv[0]);
}
