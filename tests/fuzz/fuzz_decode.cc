// libFuzzer target: decode() must classify any byte string without reading
// outside it, both as one buffer and split into an mbuf-like chain, and
// given the buffer as writable (urnicd's receive path) must classify it the
// same and leave every byte as it was; a frame it accepts as RoCE must
// re-encode to the same bytes.
#include <cstdint>
#include <cstring>
#include <vector>

#include "dataplane/wire/codec.h"

using namespace urnic::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  const auto len = static_cast<uint32_t>(size);
  // Copy so ASan sees the exact extent (the fuzzer's buffer may be larger).
  std::vector<uint8_t> frame(data, data + size);
  FrameInfo flat;
  decode(frame.data(), len, flat);

  // Writable: the ICRC check may mask headers in place, then restores them.
  {
    std::vector<uint8_t> w = frame;
    const ConstBuf seg{w.data(), len};
    FrameInfo in_place;
    decode({&seg, 1}, len, in_place, false, w.data());
    if (in_place.kind != flat.kind || in_place.why != flat.why || w != frame)
      __builtin_trap();
  }

  // Same bytes in segments; the split point comes from the first byte.
  if (size > 2) {
    const uint32_t cut = 1 + data[0] % (len - 1);
    std::vector<uint8_t> a(frame.begin(), frame.begin() + cut);
    std::vector<uint8_t> b(frame.begin() + cut, frame.end());
    const ConstBuf segs[] = {{a.data(), cut}, {b.data(), len - cut}};
    FrameInfo split;
    decode(segs, len, split);
    // Either it needed headers beyond the cut, or it agrees with flat.
    if (!(split.kind == FrameKind::kMalformed &&
          split.why == Malformed::kSplitHeaders) &&
        split.kind != flat.kind)
      __builtin_trap();
  }

  if (flat.kind == FrameKind::kRoce) {
    // Round trip: re-encoding the decoded fields must give back a frame
    // that decodes to the same fields (IP options/trailers aside).
    std::vector<uint8_t> out(size + 64);
    const uint32_t n =
        encode_frame(flat.roce, frame.data() + flat.payload_off, out.data(),
                     static_cast<uint32_t>(out.size()));
    if (n == 0) __builtin_trap();
    FrameInfo again;
    decode(out.data(), n, again);
    if (again.kind != FrameKind::kRoce || !(again.roce == flat.roce))
      __builtin_trap();
  }
  return 0;
}
