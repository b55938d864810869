// What tests/unit/fake_verbs.cc (the libibverbs stand-in of test_forward)
// records and returns.
#pragma once

#include <cstdint>
#include <type_traits>

#include "verbs-shim/shim.h"  // verbs.h without its inline wrappers

namespace fake_verbs {

// The verb the fake last ran, and its first argument.
extern __attribute__((visibility("default"))) const char* last_verb;
extern __attribute__((visibility("default"))) const void* last_first;

template <typename First, typename... Rest>
const void* first_of(First first, Rest...) {
  if constexpr (std::is_pointer_v<First>)
    return first;
  else
    return nullptr;
}

// A value no real path of the shim returns.
template <typename R>
R fake_result() {
  if constexpr (std::is_void_v<R>)
    return;
  else if constexpr (std::is_pointer_v<R>)
    return reinterpret_cast<R>(uintptr_t{0xf00d0});
  else
    return static_cast<R>(4242);
}

}  // namespace fake_verbs
