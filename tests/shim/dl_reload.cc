// dl_reload: a program that does not link libibverbs and loads it the way a
// plugin does (dlopen), lists and opens the devices through the verbs the
// preloaded shim exports, unloads it, maps other libraries, then does it
// all again. The shim keeps pointers into the real libibverbs: Open MPI's
// btl ofi unloads libfabric and libibverbs when it finds no provider, and
// UCX's next ibv_get_device_list then jumped to whatever was mapped there
// (SIGSEGV in MPI_Init). Run by tests/integration/verbs_shim.sh under
// LD_PRELOAD=liburnic-verbs.so.
//   usage: dl_reload [DEVICE]   (default urnic0); exit 0 if both rounds
//   found and opened DEVICE and libibverbs stayed loaded after dlclose.
#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace {

template <typename Fn>
Fn sym(const char* name) {
  // RTLD_DEFAULT: the first definition in the process, the shim's.
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

bool round_trip(const char* want, int round) {
  void* h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    std::printf("FAIL round %d: dlopen libibverbs: %s\n", round, dlerror());
    return false;
  }
  auto get_list = sym<ibv_device** (*)(int*)>("ibv_get_device_list");
  auto free_list = sym<void (*)(ibv_device**)>("ibv_free_device_list");
  auto name = sym<const char* (*)(ibv_device*)>("ibv_get_device_name");
  auto open_dev = sym<ibv_context* (*)(ibv_device*)>("ibv_open_device");
  auto close_dev = sym<int (*)(ibv_context*)>("ibv_close_device");
  bool ok = false;
  int n = 0;
  ibv_device** list = get_list ? get_list(&n) : nullptr;
  for (int i = 0; list && i < n; ++i) {
    if (std::strcmp(name(list[i]), want) != 0) continue;
    ibv_context* ctx = open_dev(list[i]);
    ok = ctx && close_dev(ctx) == 0;
  }
  if (list) free_list(list);
  dlclose(h);
  std::printf("%s round %d: %d devices, %s %s\n", ok ? "ok" : "FAIL", round, n,
              want, ok ? "opened and closed" : "not found or not opened");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const char* want = argc > 1 ? argv[1] : "urnic0";
  bool ok = round_trip(want, 1);
  // Where libibverbs was: whatever else gets loaded now.
  for (const char* other : {"libz.so.1", "libnl-3.so.200", "libm.so.6",
                            "libucs.so.0", "libucm.so.0"})
    dlopen(other, RTLD_NOW);
  void* still = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  std::printf("%s libibverbs %s after its dlclose\n", still ? "ok" : "FAIL",
              still ? "stayed loaded" : "was unloaded");
  ok = ok && still;
  ok = round_trip(want, 2) && ok;
  return ok ? 0 : 1;
}
