// Microbenchmarks of the wire layer: decode (with ICRC check) and encode ns
// per packet, ICRC throughput against memcpy over the same bytes.
// Run: build/perf/bench_wire   (numbers in perf/README.md)
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "dataplane/wire/codec.h"
#include "dataplane/wire/icrc.h"

using namespace urnic::wire;

namespace {

RoceFields fields(uint32_t payload) {
  RoceFields f;
  f.dst_mac = MacAddr{{2, 0, 0, 0, 0, 2}};
  f.src_mac = MacAddr{{2, 0, 0, 0, 0, 1}};
  gid_from_ipv4(0x0a4d0001, f.sgid);
  gid_from_ipv4(0x0a4d0002, f.dgid);
  f.opcode = opcode::kRcWriteOnly;
  f.reth_va = 0x7f0000001000;
  f.reth_rkey = 0x1234;
  f.reth_len = payload;
  f.dqpn = 17;
  f.psn = 100;
  f.payload_len = payload;
  return f;
}

void BM_Decode(benchmark::State& st) {
  const uint32_t payload = static_cast<uint32_t>(st.range(0));
  const RoceFields f = fields(payload);
  std::vector<uint8_t> pl(payload, 0x5a), buf(payload + 256);
  const uint32_t n =
      encode_frame(f, pl.data(), buf.data(), static_cast<uint32_t>(buf.size()));
  FrameInfo fi;
  for (auto _ : st) {
    decode(buf.data(), n, fi);
    benchmark::DoNotOptimize(fi.kind);
  }
  if (fi.kind != FrameKind::kRoce) st.SkipWithError("did not decode");
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * n);
}

// The same, the frame handed over as writable (urnicd's receive path: the
// ICRC check masks the headers in place, one CRC call for any payload).
void BM_DecodeWritable(benchmark::State& st) {
  const uint32_t payload = static_cast<uint32_t>(st.range(0));
  const RoceFields f = fields(payload);
  std::vector<uint8_t> pl(payload, 0x5a), buf(payload + 256);
  const uint32_t n =
      encode_frame(f, pl.data(), buf.data(), static_cast<uint32_t>(buf.size()));
  const ConstBuf seg{buf.data(), n};
  FrameInfo fi;
  for (auto _ : st) {
    decode({&seg, 1}, n, fi, false, buf.data());
    benchmark::DoNotOptimize(fi.kind);
  }
  if (fi.kind != FrameKind::kRoce) st.SkipWithError("did not decode");
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * n);
}

// Headers + ICRC for a payload that stays where it is (the zero-copy TX
// path: the payload is an external buffer, only read for the CRC).
void BM_EncodeHeadersAndTrailer(benchmark::State& st) {
  const uint32_t payload = static_cast<uint32_t>(st.range(0));
  const RoceFields f = fields(payload);
  std::vector<uint8_t> pl(payload, 0x5a);
  uint8_t hdr[128], trailer[8];
  const ConstBuf piece{pl.data(), payload};
  for (auto _ : st) {
    const uint32_t h = encode_headers(f, hdr, sizeof hdr);
    benchmark::DoNotOptimize(h);
    benchmark::DoNotOptimize(encode_trailer(hdr, f, {&piece, 1}, trailer));
  }
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * payload);
}

// The same from a QP's prebuilt Ethernet..UDP bytes (what the engine does
// for RC/UC packets): copy and patch instead of writing every field and
// summing the IPv4 header. Headers alone, and with the ICRC.
void BM_EncodeHeaders(benchmark::State& st) {
  const RoceFields f = fields(64);
  uint8_t hdr[128];
  for (auto _ : st) {
    benchmark::DoNotOptimize(encode_headers(f, hdr, sizeof hdr));
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations());
}
void BM_EncodeHeadersPrebuilt(benchmark::State& st) {
  const RoceFields f = fields(64);
  HeaderTemplate t;
  build_template(f, t);
  uint8_t hdr[128];
  for (auto _ : st) {
    benchmark::DoNotOptimize(encode_headers(t, f, hdr, sizeof hdr));
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations());
}
void BM_EncodeHeadersPrebuiltAndTrailer(benchmark::State& st) {
  const uint32_t payload = static_cast<uint32_t>(st.range(0));
  const RoceFields f = fields(payload);
  HeaderTemplate t;
  build_template(f, t);
  std::vector<uint8_t> pl(payload, 0x5a);
  uint8_t hdr[128], trailer[8];
  const ConstBuf piece{pl.data(), payload};
  for (auto _ : st) {
    const uint32_t h = encode_headers(t, f, hdr, sizeof hdr);
    benchmark::DoNotOptimize(h);
    benchmark::DoNotOptimize(encode_trailer(hdr, f, {&piece, 1}, trailer));
  }
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * payload);
}

// A payload that may change (a READ response, a UD send) into the frame:
// copied once and summed as copied (TxFrame::unsealed, the worker's
// MbufChain::put with a TrailerSum), against what 5d74272..bf4030e did:
// copied into the engine's bounce buffer, summed there, copied again.
// Trailer included; headers prebuilt outside the loop.
void BM_PayloadCopiedOnceAndSummed(benchmark::State& st) {
  const uint32_t payload = static_cast<uint32_t>(st.range(0));
  const RoceFields f = fields(payload);
  std::vector<uint8_t> pl(payload, 0x5a), frame(payload + 256);
  uint8_t hdr[128];
  const uint32_t hl = encode_headers(f, hdr, sizeof hdr);
  for (auto _ : st) {
    TrailerSum sum(hdr, f);
    std::memcpy(frame.data() + hl, pl.data(), payload);
    sum.update(frame.data() + hl, payload);
    benchmark::DoNotOptimize(sum.finish(frame.data() + hl + payload));
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * payload);
}
void BM_PayloadCopiedTwice(benchmark::State& st) {
  const uint32_t payload = static_cast<uint32_t>(st.range(0));
  const RoceFields f = fields(payload);
  std::vector<uint8_t> pl(payload, 0x5a), bounce(payload), frame(payload + 256);
  uint8_t hdr[128], trailer[8];
  const uint32_t hl = encode_headers(f, hdr, sizeof hdr);
  for (auto _ : st) {
    std::memcpy(bounce.data(), pl.data(), payload);
    const ConstBuf piece{bounce.data(), payload};
    const uint32_t tl = encode_trailer(hdr, f, {&piece, 1}, trailer);
    std::memcpy(frame.data() + hl, bounce.data(), payload);
    std::memcpy(frame.data() + hl + payload, trailer, tl);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(st.iterations() * payload);
}

void BM_Crc32(benchmark::State& st) {
  std::vector<uint8_t> b(static_cast<size_t>(st.range(0)), 0xa5);
  uint32_t c = 0;
  for (auto _ : st) {
    c = crc32(c, b.data(), b.size());
    benchmark::DoNotOptimize(c);
  }
  st.SetBytesProcessed(st.iterations() * st.range(0));
}

void BM_Memcpy(benchmark::State& st) {
  std::vector<uint8_t> a(static_cast<size_t>(st.range(0)), 0xa5), b(a.size());
  for (auto _ : st) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * st.range(0));
}

}  // namespace

BENCHMARK(BM_Decode)->Arg(0)->Arg(64)->Arg(1024)->Arg(4096);
BENCHMARK(BM_DecodeWritable)->Arg(1024)->Arg(4096);
BENCHMARK(BM_EncodeHeadersAndTrailer)->Arg(0)->Arg(64)->Arg(1024)->Arg(4096);
BENCHMARK(BM_EncodeHeaders);
BENCHMARK(BM_EncodeHeadersPrebuilt);
BENCHMARK(BM_EncodeHeadersPrebuiltAndTrailer)
    ->Arg(0)
    ->Arg(64)
    ->Arg(1024)
    ->Arg(4096);
BENCHMARK(BM_PayloadCopiedOnceAndSummed)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(4096);
BENCHMARK(BM_PayloadCopiedTwice)->Arg(64)->Arg(256)->Arg(1024)->Arg(4096);
BENCHMARK(BM_Crc32)->RangeMultiplier(4)->Range(64, 64 << 10);
BENCHMARK(BM_Memcpy)->RangeMultiplier(4)->Range(64, 64 << 10);
BENCHMARK_MAIN();
