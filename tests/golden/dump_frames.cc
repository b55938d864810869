// Prints frames made by urnic's encoder, one per line in the format of
// icrc_vectors.txt, for check_encoder.py to verify with independent code.
#include <cstdio>
#include <vector>

#include "dataplane/wire/codec.h"

using namespace urnic::wire;

int main() {
  uint32_t seq = 0;
  for (int op = 0; op < 256; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(op));
    if (!info.valid()) continue;
    for (int v = 0; v < 8; ++v) {
      RoceFields f;
      f.dst_mac = MacAddr{{0x02, 0, 0, 0, 0, 2}};
      f.src_mac = MacAddr{{0x02, 0, 0, 0, 0, 1}};
      f.ipv6 = v & 1;
      f.vlan = v & 2;
      f.vlan_tci = 0x2064;
      if (f.ipv6) {
        for (int i = 0; i < 16; ++i) {
          f.sgid[i] = static_cast<uint8_t>(0xfd + i * 3);
          f.dgid[i] = static_cast<uint8_t>(0xfd + i * 5);
        }
        f.flow_label = 0x12345 + seq;
      } else {
        gid_from_ipv4(0x0a4d0001, f.sgid);
        gid_from_ipv4(0x0a4d0002, f.dgid);
      }
      f.tclass = static_cast<uint8_t>(seq * 37);
      f.ttl = static_cast<uint8_t>(1 + seq % 200);
      f.ip_id = static_cast<uint16_t>(seq * 101);
      f.udp_sport = static_cast<uint16_t>(0xc000 + seq);
      f.opcode = static_cast<uint8_t>(op);
      f.se = seq & 1;
      f.fecn = seq & 2;
      f.becn = seq & 4;
      f.pkey = 0xffff;
      f.dqpn = 0x11 + seq * 7;
      f.ack_req = seq & 8;
      f.psn = (0xfffff0 + seq) & 0xffffff;  // crosses the 2^24 wrap
      f.reth_va = 0x7f0011223344ull + seq;
      f.reth_rkey = 0xabc00000 | seq;
      f.reth_len = 4096;
      f.aeth_syndrome = static_cast<uint8_t>(seq);
      f.aeth_msn = seq * 3;
      f.atomic_va = 0x1000 + 8ull * seq;
      f.atomic_rkey = 0x55;
      f.atomic_swap_add = 0x0102030405060708ull;
      f.atomic_compare = 0x1112131415161718ull;
      f.atomic_orig = 0x2122232425262728ull;
      f.imm = 0xdeadbeef;
      f.ieth_rkey = 0x66;
      f.deth_qkey = 0x11111111;
      f.deth_src_qp = 0x000abc;
      static const uint32_t kSizes[] = {0, 1, 61, 1024};
      f.payload_len =
          (info.mask & kPayload) ? kSizes[(v >> 2) * 2 + (seq & 1)] : 0;
      std::vector<uint8_t> payload(f.payload_len);
      for (size_t i = 0; i < payload.size(); ++i)
        payload[i] = static_cast<uint8_t>(i ^ seq);
      std::vector<uint8_t> buf(f.payload_len + 256);
      const uint32_t n = encode_frame(f, payload.data(), buf.data(),
                                      static_cast<uint32_t>(buf.size()));
      if (n == 0) {
        fprintf(stderr, "encode failed for %s\n", info.name);
        return 1;
      }
      printf("enc_%02x_%s%s_%u %d 1 ", op, info.name, f.vlan ? "_vlan" : "",
             seq, f.ipv6 ? 6 : 4);
      for (uint32_t i = 0; i < n; ++i) printf("%02x", buf[i]);
      printf("\n");
      ++seq;
    }
  }
  return 0;
}
