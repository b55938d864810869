// vdev_spec (dataplane/service/port.cc): the --vdev string urnicd gives
// EAL for port.vdev. net_af_packet gets ring frames that hold a frame of
// port.mtu and a frame count of 8 MiB of frames in whole blocks; net_memif
// buffers that hold a whole frame (DPDK 22.11's memif breaks frames split
// over buffers); a spec's own values stay.
#include <gtest/gtest.h>

#include <string>

#include "dataplane/service/service.h"

namespace {

using urnic::service::vdev_spec;

TEST(VdevSpec, AfPacketDefaultFrames) {
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x", 1500),
            "net_af_packet0,iface=x,framecnt=4096");
  // 2048 B frames hold a 1978 B MTU (18 B Ethernet + VLAN, 52 B TPACKET2).
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x", 1978),
            "net_af_packet0,iface=x,framecnt=4096");
}

TEST(VdevSpec, AfPacketJumboFramesFourToABlock) {
  // 9000 + 18 + 52 = 9070 -> 9216 B frames, 36 KiB blocks, 8 MiB / 9216 =
  // 910 frames, 908 in whole blocks.
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x", 9000),
            "net_af_packet0,iface=x,framesz=9216,blocksz=36864,framecnt=908");
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x", 1979),
            "net_af_packet0,iface=x,framesz=3072,blocksz=12288,framecnt=2728");
}

TEST(VdevSpec, AfPacketSpecsOwnValuesStay) {
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x,framecnt=100", 9000),
            "net_af_packet0,iface=x,framecnt=100,framesz=9216,blocksz=36864");
  // A spec's own frame size: its count keeps 8 MiB, whole blocks of a page.
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x,framesz=4096", 9000),
            "net_af_packet0,iface=x,framesz=4096,framecnt=2048");
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x,framesz=1536", 1500),
            "net_af_packet0,iface=x,framesz=1536,framecnt=5460");
  // A spec's own block size: the frame size is left to it and the PMD.
  EXPECT_EQ(vdev_spec("net_af_packet0,iface=x,blocksz=8192", 9000),
            "net_af_packet0,iface=x,blocksz=8192,framecnt=4096");
}

TEST(VdevSpec, MemifBuffersHoldTheFrame) {
  EXPECT_EQ(vdev_spec("net_memif0,id=0", 1500), "net_memif0,id=0");
  EXPECT_EQ(vdev_spec("net_memif0,id=0", 2030), "net_memif0,id=0");
  EXPECT_EQ(vdev_spec("net_memif0,id=0", 2031), "net_memif0,id=0,bsize=2176");
  EXPECT_EQ(vdev_spec("net_memif0,id=0", 9000), "net_memif0,id=0,bsize=9088");
  EXPECT_EQ(vdev_spec("net_memif0,id=0,bsize=4096", 9000),
            "net_memif0,id=0,bsize=4096");
}

TEST(VdevSpec, OtherVdevsUnchanged) {
  EXPECT_EQ(vdev_spec("net_tap0,iface=t", 9000), "net_tap0,iface=t");
  EXPECT_EQ(vdev_spec("net_ring0", 9000), "net_ring0");
}

}  // namespace
