// A stand-in for libibverbs behind the shim in test_forward: every verb of
// verbs-shim/verbs.def, generated from the same table, records which verb
// was reached and with what first argument, and returns fake_result<R>().
#include "tests/unit/fake_verbs.h"

namespace fake_verbs {

const char* last_verb = nullptr;
const void* last_first = nullptr;

}  // namespace fake_verbs

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))
#define URNIC_VERB(result, name, version, missing, params, args) \
  FAKE_EXPORT result name params {                               \
    fake_verbs::last_verb = #name;                               \
    fake_verbs::last_first = fake_verbs::first_of args;          \
    return fake_verbs::fake_result<result>();                    \
  }
#define URNIC_VERB_FIXED(result, name, version, missing, urnic_result, params, \
                         args)                                                 \
  URNIC_VERB(result, name, version, missing, params, args)
#include "verbs-shim/verbs.def"
