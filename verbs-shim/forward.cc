// The exported verbs of verbs.def, generated: each sends a call to urnic's
// side (ours::) when the object it names is urnic's, and to libibverbs'
// definition otherwise, as the one preloaded library must for every other
// provider's devices. One table (verbs.def) instead of a hand-written
// forwarder per verb.
#include <cerrno>

#include "verbs-shim/shim.h"

namespace urnic::shim {
namespace {

// Whether the object a verb is called on is urnic's. nullptr is not (the
// call then goes to libibverbs, which reports it as it always has).
bool urnic_object(const ibv_device* d) {
  return urnic_device(d) != nullptr;
}
bool urnic_object(const ibv_context* c) {
  return is_urnic(c);
}
template <typename T>
requires requires(const T* o) {
  o->context;
}
bool urnic_object(const T* o) {
  return o && is_urnic(o->context);
}

// The first argument decides.
template <typename First, typename... Rest>
bool urnic_call(const First& first, const Rest&...) {
  return urnic_object(first);
}

}  // namespace
}  // namespace urnic::shim

using namespace urnic::shim;

#define URNIC_VERB(result, name, version, missing, params, args) \
  URNIC_EXPORT result name params {                              \
    if (urnic_call args) return ours::name args;                 \
    auto* const real = URNIC_REAL(name, version);                \
    return real ? real args : missing;                           \
  }
#define URNIC_VERB_FIXED(result, name, version, missing, urnic_result, params, \
                         args)                                                 \
  URNIC_EXPORT result name params {                                            \
    if (urnic_call args) return urnic_result;                                  \
    auto* const real = URNIC_REAL(name, version);                              \
    return real ? real args : missing;                                         \
  }
#include "verbs-shim/verbs.def"
