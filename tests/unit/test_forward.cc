// The shim's generated forwarders (verbs-shim/forward.cc): every verb of
// verbs.def, called on an object that is not urnic's, reaches the next
// definition (here fake_verbs.cc, standing in for libibverbs) with its
// arguments and returns its result. This binary links the shim first and
// the fake second, as LD_PRELOAD puts the shim before libibverbs.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/unit/fake_verbs.h"

namespace {

// Objects of "another provider": the device is not one the shim made.
struct Others {
  ibv_device device{};
  ibv_context context{};
  ibv_pd pd{};
  ibv_mr mr{};
  ibv_cq cq{};
  ibv_srq srq{};
  ibv_qp qp{};
  ibv_ah ah{};
  ibv_dm dm{};
  ibv_comp_channel channel{};
  Others() {
    std::strcpy(device.name, "other0");
    context.device = &device;
    pd.context = mr.context = cq.context = srq.context = qp.context =
        ah.context = dm.context = channel.context = &context;
  }
  void* get(ibv_device*) { return &device; }
  void* get(ibv_context*) { return &context; }
  void* get(ibv_pd*) { return &pd; }
  void* get(ibv_mr*) { return &mr; }
  void* get(ibv_cq*) { return &cq; }
  void* get(ibv_srq*) { return &srq; }
  void* get(ibv_qp*) { return &qp; }
  void* get(ibv_ah*) { return &ah; }
  void* get(ibv_dm*) { return &dm; }
  void* get(ibv_comp_channel*) { return &channel; }
};

// Calls `fn` with the other provider's object first and zeros after it;
// checks that the fake ran `name` with that object and that its result
// came back.
template <typename R, typename First, typename... Rest>
void expect_forwarded(const char* name, R (*fn)(First, Rest...),
                      const void* first_override = nullptr,
                      bool use_override = false) {
  static Others o;
  First first = static_cast<First>(
      use_override ? const_cast<void*>(first_override) : o.get(First{}));
  fake_verbs::last_verb = nullptr;
  fake_verbs::last_first = nullptr;
  if constexpr (std::is_void_v<R>) {
    fn(first, Rest{}...);
  } else {
    EXPECT_EQ(fn(first, Rest{}...), fake_verbs::fake_result<R>()) << name;
  }
  ASSERT_NE(fake_verbs::last_verb, nullptr) << name << " was not forwarded";
  EXPECT_STREQ(fake_verbs::last_verb, name);
  EXPECT_EQ(fake_verbs::last_first, static_cast<const void*>(first)) << name;
}

// Otherwise the test below would call the fake directly and prove nothing.
TEST(Forward, TheShimsDefinitionsComeFirst) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&ibv_alloc_pd), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_NE(std::strstr(info.dli_fname, "liburnic-verbs"), nullptr)
      << info.dli_fname;
}

TEST(Forward, EveryVerbOnAnotherProvidersObjectReachesTheNextDefinition) {
  int n = 0;
#define URNIC_VERB(result, name, version, missing, params, args) \
  expect_forwarded(#name, &name);                                \
  ++n;
#define URNIC_VERB_FIXED(result, name, version, missing, urnic_result, params, \
                         args)                                                 \
  URNIC_VERB(result, name, version, missing, params, args)
#include "verbs-shim/verbs.def"
#undef URNIC_VERB
#undef URNIC_VERB_FIXED
  EXPECT_GT(n, 50);
}

// A null object is not urnic's either: libibverbs gets it, as it would
// without the shim.
TEST(Forward, ANullObjectIsForwardedAsItIs) {
  expect_forwarded("ibv_dealloc_pd", &ibv_dealloc_pd, nullptr, true);
  expect_forwarded("ibv_destroy_qp", &ibv_destroy_qp, nullptr, true);
  expect_forwarded("ibv_alloc_pd", &ibv_alloc_pd, nullptr, true);
  expect_forwarded("ibv_get_device_name", &ibv_get_device_name, nullptr, true);
}

}  // namespace
