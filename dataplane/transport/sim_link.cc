#include "dataplane/transport/sim_link.h"

#include <limits>

#include "dataplane/wire/codec.h"

namespace urnic::transport {

uint64_t SimLink::delay() {
  uint64_t d = p_.delay_ns;
  if (p_.jitter_ns)
    d += std::uniform_int_distribution<uint64_t>(0, p_.jitter_ns)(rng_);
  return d;
}

void SimLink::send(int from, std::span<const uint8_t> frame, uint64_t now_ns) {
  SimLinkStats& st = stats_[from];
  auto& q = q_[1 - from];
  ++st.sent;
  // Draw every decision for every frame, in a fixed order, so that changing
  // one probability does not reshuffle the others' random streams.
  const bool lose = chance(p_.loss);
  const bool dup = chance(p_.duplicate);
  const bool hold = chance(p_.reorder);
  const bool flip = chance(p_.corrupt);
  const uint64_t bit = rng_();
  const uint64_t d1 = delay(), d2 = delay();
  if (lose) {
    ++st.lost;
    return;
  }
  std::vector<uint8_t> bytes(frame.begin(), frame.end());
  uint64_t depart = now_ns;
  switch (queue_[from].admit(now_ns, static_cast<uint32_t>(bytes.size()),
                             &depart)) {
    case Bottleneck::Verdict::kDrop:
      ++st.queue_drops;
      return;
    case Bottleneck::Verdict::kMark:
      if (wire::mark_ce(bytes.data(), static_cast<uint32_t>(bytes.size())))
        ++st.ce_marked;
      break;
    case Bottleneck::Verdict::kPass:
      break;
  }
  if (flip && !bytes.empty()) {
    ++st.corrupted;
    bytes[(bit >> 3) % bytes.size()] ^= static_cast<uint8_t>(1u << (bit & 7));
  }
  uint64_t at = depart + d1;
  if (hold) {
    ++st.reordered;
    at += p_.reorder_hold_ns;
  }
  if (dup) {
    ++st.duplicated;
    q.push({depart + d2 + (hold ? 0 : p_.reorder_hold_ns / 2), seq_++, bytes});
  }
  q.push({at, seq_++, std::move(bytes)});
}

size_t SimLink::receive(int to, uint64_t now_ns,
                        std::vector<std::vector<uint8_t>>& out) {
  auto& q = q_[to];
  size_t n = 0;
  while (!q.empty() && q.top().at <= now_ns) {
    // Moving the bytes out of top() before pop() is safe: the heap order
    // reads only `at` and `seq`.
    out.push_back(std::move(const_cast<InFlight&>(q.top()).bytes));
    q.pop();
    ++n;
  }
  stats_[1 - to].delivered += n;
  return n;
}

uint64_t SimLink::next_arrival(int to) const {
  return q_[to].empty() ? std::numeric_limits<uint64_t>::max()
                        : q_[to].top().at;
}

}  // namespace urnic::transport
