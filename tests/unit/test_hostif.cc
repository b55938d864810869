// The host interface's verbs rules (dataplane/hostif/verbs.h): what the
// device and its driver, the shim, both decide the same way.
#include <gtest/gtest.h>

#include "dataplane/hostif/verbs.h"

namespace urnic::hostif {
namespace {

TEST(Hostif, MrAccessAsTheKernelChecksIt) {
  EXPECT_EQ(mr_access_error(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
            0);
  EXPECT_EQ(mr_access_error(IBV_ACCESS_REMOTE_WRITE), EINVAL);  // no local
  EXPECT_EQ(mr_access_error(IBV_ACCESS_REMOTE_ATOMIC), EINVAL);
  EXPECT_EQ(mr_access_error(1u << 30), EINVAL);  // unknown
  EXPECT_EQ(mr_access_error(IBV_ACCESS_ON_DEMAND), EOPNOTSUPP);
  EXPECT_EQ(mr_access_error(IBV_ACCESS_HUGETLB), 0);  // a hint
}

// Linux's ib_get_eth_speed for a driver that reports no lanes.
TEST(Hostif, LinkRateAsLinuxReportsARocePort) {
  struct Row {
    uint32_t mbps;
    uint8_t width, speed;
  };
  for (const Row& r :
       {Row{0, 1, 1}, Row{1000, 1, 1}, Row{10000, 1, 8}, Row{20000, 2, 2},
        Row{25000, 1, 32}, Row{40000, 2, 8}, Row{50000, 16, 32},
        Row{100000, 2, 32}, Row{200000, 2, 64}, Row{400000, 2, 128}}) {
    const IbLinkRate l = ib_link_rate(r.mbps);
    EXPECT_EQ(l.width, r.width) << r.mbps;
    EXPECT_EQ(l.speed, r.speed) << r.mbps;
  }
}

}  // namespace
}  // namespace urnic::hostif
