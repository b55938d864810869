// The opcode table against IBTA vol. 1 table 38 and 9.2-9.5 header rules.
#include <gtest/gtest.h>

#include "dataplane/wire/opcode.h"

using namespace urnic::wire;

TEST(Opcode, EverySupportedOpcodeIsConsistent) {
  int n = 0;
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo& i = opcode_info(static_cast<uint8_t>(op));
    if (!i.valid()) continue;
    ++n;
    SCOPED_TRACE(i.name);
    // Exactly one transport.
    const int transports = !!(i.mask & kRc) + !!(i.mask & kUc) +
                           !!(i.mask & kUd) + !!(i.mask & kCnpOp);
    EXPECT_EQ(transports, 1);
    // CNP is neither request nor response; everything else is one of them.
    if (!(i.mask & kCnpOp)) {
      EXPECT_NE(!!(i.mask & kReq), !!(i.mask & kResp));
    }
    // Header length is BTH plus the sizes of the headers it carries.
    uint32_t len = sizeof(Bth);
    for (uint8_t e = 0; e < kExtCount; ++e)
      if (i.mask & (1u << e)) len += kExtSize[e];
    EXPECT_EQ(i.hdr_len, len);
    // RETH only on first/only writes and read requests (9.3.3).
    if (i.mask & kReth) {
      EXPECT_TRUE((i.mask & kRead) || ((i.mask & kWrite) && (i.mask & kFirst)));
    }
    // AETH on every response except read-response middle (9.3.5).
    if ((i.mask & kResp) && !(i.mask & kMiddle)) {
      EXPECT_TRUE(i.mask & kAeth);
    }
    // Immediate data and invalidate only on last/only packets.
    if (i.mask & (kImm | kIeth)) {
      EXPECT_TRUE(i.mask & kLast);
    }
    // UD carries a DETH, nothing else does.
    EXPECT_EQ(!!(i.mask & kUd), !!(i.mask & kDeth));
  }
  EXPECT_EQ(n, 24 + 12 + 2 + 1);  // RC (ATOMIC_WRITE too), UC, UD, CNP
}

TEST(Opcode, UcMirrorsRcSendAndWrite) {
  for (uint8_t op = 0; op <= opcode::kRcWriteOnlyImm; ++op) {
    const OpcodeInfo& rc = opcode_info(op);
    const OpcodeInfo& uc =
        opcode_info(static_cast<uint8_t>(opcode::kUcBase + op));
    ASSERT_TRUE(uc.valid()) << rc.name;
    EXPECT_EQ(rc.mask & ~kRc, uc.mask & ~kUc) << rc.name;
  }
}

TEST(Opcode, RdAndReservedAreUnsupported) {
  for (int op = 0x40; op < 0x60; ++op)
    EXPECT_FALSE(opcode_info(static_cast<uint8_t>(op)).valid());
  EXPECT_FALSE(opcode_info(0x15).valid());
  EXPECT_FALSE(opcode_info(0x66).valid());
  EXPECT_FALSE(opcode_info(0xff).valid());
}
