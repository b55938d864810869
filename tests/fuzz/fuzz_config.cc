// libFuzzer target: the config loader. Any text, as a file or as an -o
// override, must either give a Config or throw ConfigError (the one-line
// error urnicd prints); nothing else may escape. A Config it accepts must
// survive dump() and parse() unchanged.
#include <cstdint>
#include <string>
#include <vector>

#include "config/urnic_config.h"

using namespace urnic::config;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 8192) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The first byte picks the form: the whole input as a file, or the
  // embedded default with the input as one override ("key=value").
  const bool as_override = size && (data[0] & 1);
  // Overrides go onto the embedded default's settings as dump() writes
  // them: the same Config (the round trip below checks that) in 2.4 KB
  // instead of 13 KB of comments, whose parse was most of this target's
  // time and the same for every input.
  static const std::string base = dump(parse(embedded_default(), "default"));
  try {
    const Config c = as_override ? parse(base, "fuzz", {text.substr(1)})
                                 : parse(text, "fuzz");
    const Config again = parse(dump(c), "dump");
    if (!(again == c)) __builtin_trap();
  } catch (const ConfigError&) {
    // A clear refusal: what should happen to most inputs.
  }
  return 0;
}
