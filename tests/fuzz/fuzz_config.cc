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
  try {
    const Config c = as_override
                         ? parse(embedded_default(), "fuzz", {text.substr(1)})
                         : parse(text, "fuzz");
    const Config again = parse(dump(c), "dump");
    if (!(again == c)) __builtin_trap();
  } catch (const ConfigError&) {
    // A clear refusal: what should happen to most inputs.
  }
  return 0;
}
