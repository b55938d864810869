#!/usr/bin/python3
"""perf/run-suite's bookkeeping: records, log parsing, the table, the results
JSON and the RESULTS.md row. Standard library only.

  suite_report.py add RECORDS key=value...   append one record (values that
                                             parse as JSON are stored as such)
  suite_report.py check RECORDS ID           exit 1 (with the reason) if the
                                             step's output has no result
  suite_report.py show RECORDS ID            one line: the step's result
  suite_report.py build RECORDS --json OUT --md RESULTS.md
                                             parse every log, print the
                                             table, write OUT, append a row
"""
import json
import os
import re
import statistics
import sys

TARGET_BW = 0.90  # perftest/urnic-perf 64 KiB WRITE vs raw link (payload bits)
TARGET_RATE = 0.50  # 64 B message rate vs raw 64 B frames/s
TARGET_LAT_TYP = 3.0  # ib_read_lat 2 B typical, us
TARGET_LAT_P999 = 10.0  # ib_read_lat 2 B p99.9, us
TARGET_QP_SCALE = 0.80  # 1024 QPs aggregate vs 1 QP
TARGET_COST = 2.0  # urnic sender cycles/packet <= 2x testpmd txonly (issue 13)
TARGET_SVC_PER_QP = 64 * 1024  # service bytes per QP beyond rings
TARGET_SHIM = 4 * 1024 * 1024  # application (shim) bytes beyond rings

LOG_TAIL = 40  # lines of a log kept in the JSON


# ---------------------------------------------------------------- records
def load_records(path):
    recs = []
    with open(path) as f:
        for line in f:
            if line.strip():
                recs.append(json.loads(line))
    return recs


# Always text, though they may look like numbers: a short commit hash such
# as 52037e3 parses as 52037000.0.
TEXT_KEYS = {"commit", "host", "date", "time", "id", "kind"}


def add(path, pairs):
    r = {}
    for p in pairs:
        k, _, v = p.partition("=")
        if k in TEXT_KEYS:
            r[k] = v
            continue
        try:
            r[k] = json.loads(v)
        except ValueError:
            r[k] = v
        # Other strings that happen to parse as numbers stay numbers; the
        # few free-text fields that are all digits do not matter.
    with open(path, "a") as f:
        f.write(json.dumps(r) + "\n")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(path, n=LOG_TAIL):
    return read(path).splitlines()[-n:]


# ---------------------------------------------------------------- parsers
def parse_testpmd(rec):
    """Rx-pps samples of testpmd's periodic port statistics (rxonly side).
    The first non-zero sample covers a partial second: it is dropped."""
    text = read(rec.get("log", ""))
    pps = [int(x) for x in re.findall(r"Rx-pps:\s+(\d+)", text)]
    bps = [int(x) for x in re.findall(r"Rx-bps:\s+(\d+)", text)]
    tx = [int(x) for x in re.findall(r"Tx-pps:\s+(\d+)", read(rec.get("log_tx", "")))]
    # --record-core-cycles, printed when testpmd stops: by whichever side
    # got to print before both were stopped (txonly or rxonly).
    cyc = []
    for log in ("log_tx", "log"):
        cyc += re.findall(r"CPU cycles/packet=([\d.]+) \(total cycles=\d+ / total (\w+) packets",
                          read(rec.get(log, "")))
    nz = [i for i, v in enumerate(pps) if v > 0]
    if not nz:
        return {"error": "no packets received (Rx-pps all 0 or missing)"}
    used = [pps[i] for i in nz[1:]] or [pps[nz[0]]]
    used_bps = [bps[i] for i in nz[1:] if i < len(bps)] or [0]
    frame = int(rec["frame"])
    payload = int(rec.get("payload", 0))
    mean = statistics.mean(used)
    out = {
        "rx_pps_samples": pps,
        "rx_bps_samples": bps,
        "tx_pps_samples_sender": tx,
        "samples_used": len(used),
        "pps": mean,
        "mpps": mean / 1e6,
        "gbps_frame": mean * frame * 8 / 1e9,
        "gbps_testpmd_rx_bps": statistics.mean(used_bps) / 1e9,
        "gbps_payload": mean * payload * 8 / 1e9 if payload else None,
        "cycles_per_pkt": float(cyc[0][0]) if cyc else None,
        "cycles_side": cyc[0][1] if cyc else None,
    }
    return out


NUM = r"([\d.]+)"


def parse_perftest_bw(rec):
    rows = []
    for line in read(rec.get("log", "")).splitlines():
        m = re.match(r"^\s*(\d+)\s+(\d+)\s+" + NUM + r"\s+" + NUM + r"\s+" + NUM + r"\s*$", line)
        if m:
            rows.append({
                "bytes": int(m.group(1)),
                "iterations": int(m.group(2)),
                "gbps_peak": float(m.group(3)),
                "gbps": float(m.group(4)),
                "mpps": float(m.group(5)),
                "line": line.strip(),
            })
    if not rows:
        return {"error": "no result row in perftest's output"}
    return {"rows": rows}


def parse_perftest_lat(rec):
    names = ["t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p999"]
    for line in read(rec.get("log", "")).splitlines():
        m = re.match(r"^\s*(\d+)\s+(\d+)((?:\s+[\d.]+){7})\s*$", line)
        if m:
            vals = [float(x) for x in m.group(3).split()]
            out = {"bytes": int(m.group(1)), "iterations": int(m.group(2)), "line": line.strip()}
            out.update(dict(zip(names, vals)))
            return out
    return {"error": "no result row in perftest's output"}


def parse_uperf(rec):
    if rec.get("missing"):
        return {"error": "urnic-perf: not built"}
    try:
        with open(rec["json"]) as f:
            j = json.load(f)
    except (OSError, ValueError) as e:
        return {"error": "no JSON from urnic-perf: %s" % e}
    res = (j.get("results") or [{}])[0]
    if not res or "ops" not in res:
        return {"error": "urnic-perf JSON has no results", "json": j}
    if res.get("errors") or res.get("verify_errors"):
        return {"error": "urnic-perf counted errors", "json": j}
    return {"json": j, "result": res, "service": j.get("service"),
            "cost": uperf_cost(rec.get("stats"))}


def uperf_cost(prefix):
    """Busy cycles per packet of each service's workers over the run, from
    urnicctl stats --json before and after: the sender's (B) per packet
    sent, the receiver's (A) per packet received."""
    if not prefix:
        return None
    try:
        snap = {(s, k): json.load(open("%s-%s-%d.json" % (prefix, s, k)))
                for s in "ab" for k in (0, 1)}
    except (OSError, ValueError):
        return None

    def delta(side, key):
        return sum(l.get(key, 0) for l in snap[(side, 1)]["lcores"]) - \
            sum(l.get(key, 0) for l in snap[(side, 0)]["lcores"])
    out = {}
    for side, pk, name in (("b", "tx_packets", "send"), ("a", "rx_packets", "recv")):
        n = delta(side, pk)
        cyc = delta(side, "cycles_busy")
        hz = snap[(side, 1)].get("tsc_hz") or 0
        if n > 0:
            out[name + "_cycles_per_pkt"] = cyc / n
            out[name + "_ns_per_pkt"] = cyc / n / hz * 1e9 if hz else None
    return out or None


def kib_pair(s):
    """'RSS PSS' (kB) -> (int, int) or None."""
    if not s or not isinstance(s, str):
        return None
    a = s.split()
    return (int(a[0]), int(a[1])) if len(a) == 2 else None


def parse_memory(rec):
    if rec.get("missing"):
        return {"error": "urnic-perf: not built"}
    out = {
        "tool": rec.get("tool", "urnic-perf"),
        "urnicd_a_rss_pss_kib": kib_pair(rec.get("rss_pss_a")),
        "urnicd_b_rss_pss_kib": kib_pair(rec.get("rss_pss_b")),
        "app_rss_pss_kib": kib_pair(rec.get("rss_pss_app")),
    }
    out["app_memory"] = None
    if out["tool"] != "perftest":
        try:
            with open(rec["json"]) as f:
                out["app_memory"] = json.load(f).get("memory")
        except (OSError, ValueError, KeyError) as e:
            out["app_error"] = "no JSON from urnic-perf: %s" % e
    if not rec.get("up") or out["urnicd_b_rss_pss_kib"] is None:
        out["error"] = "QPs did not come up"
    return out


def parse_control(rec):
    if rec.get("missing"):
        return {"error": "verbs-setup: not built"}
    try:
        with open(rec["json"]) as f:
            out = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, KeyError, IndexError) as e:
        return {"error": "no JSON from verbs-setup (rc %s): %s" % (rec.get("rc"), e)}
    return out


def control_text(p):
    def m(verb):
        return p.get(verb, {}).get("mean_us", 0)
    return ("%.0f us per QP (create %.0f, modify INIT/RTR/RTS %.0f/%.0f/%.0f, destroy %.0f; "
            "modify RTR p99 %.0f); reg_mr %.0f (new memory %.0f), create_cq %.0f us" % (
                p["per_qp_us"], m("ibv_create_qp"), m("modify INIT"), m("modify RTR"),
                m("modify RTS"), m("ibv_destroy_qp"), p.get("modify RTR", {}).get("p99_us", 0),
                m("ibv_reg_mr"), m("ibv_reg_mr new"), m("ibv_create_cq")))


PARSERS = {
    "testpmd": parse_testpmd,
    "perftest_bw": parse_perftest_bw,
    "perftest_sweep": parse_perftest_bw,
    "perftest_lat": parse_perftest_lat,
    "uperf": parse_uperf,
    "memory": parse_memory,
    "control": parse_control,
}


def find(recs, sid):
    """The measurement record of a step (not its failure marks)."""
    for r in reversed(recs):
        if r.get("id") == sid and r.get("kind") in PARSERS:
            return r
    return None


def summary(rec, parsed):
    k = rec["kind"]
    if "error" in parsed:
        return "ERROR: " + parsed["error"]
    if k == "testpmd":
        s = "%.3f Mpps, %.2f Gb/s frame bits" % (parsed["mpps"], parsed["gbps_frame"])
        if parsed["gbps_payload"] is not None:
            s += ", %.2f Gb/s RoCE payload" % parsed["gbps_payload"]
        if parsed.get("cycles_per_pkt"):
            s += "; %s %.0f cycles/pkt" % (parsed["cycles_side"], parsed["cycles_per_pkt"])
        return s
    if k == "perftest_bw":
        r = parsed["rows"][-1]
        return "%.2f Gb/s, %.4f Mpps" % (r["gbps"], r["mpps"])
    if k == "perftest_sweep":
        # Every row is in the JSON; the table shows a few sizes.
        show = (2, 64, 1024, 4096, 65536, 1 << 20, 8 << 20)
        rows = [r for r in parsed["rows"] if r["bytes"] in show] or parsed["rows"]
        return "%d sizes; " % len(parsed["rows"]) + ", ".join(
            "%s %.2f" % (size_name(r["bytes"]), r["gbps"]) for r in rows) + " Gb/s"
    if k == "perftest_lat":
        return "typical %.2f us, p99 %.2f, p99.9 %.2f, max %.2f" % (
            parsed["t_typical"], parsed["p99"], parsed["p999"], parsed["t_max"])
    if k == "uperf":
        r = parsed["result"]
        c = parsed.get("cost") or {}
        cost = ""
        if c.get("send_ns_per_pkt") is not None and c.get("recv_ns_per_pkt") is not None:
            cost = "; ns/pkt send %.0f recv %.0f" % (c["send_ns_per_pkt"], c["recv_ns_per_pkt"])
        return "%.2f Gb/s, %.4f Mops/s%s%s" % (r.get("gbps", 0), r.get("mops", 0),
                                              svc_text(parsed.get("service")), cost)
    if k == "memory":
        a, b = parsed["urnicd_a_rss_pss_kib"], parsed["urnicd_b_rss_pss_kib"]
        return "urnicd A %s, B %s kB RSS/PSS" % (a, b)
    if k == "control":
        return control_text(parsed)
    return ""


def size_name(b):
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return "%dMiB" % (b >> 20)
    if b >= 1024 and b % 1024 == 0:
        return "%dKiB" % (b >> 10)
    return "%dB" % b


def svc_text(svc):
    if not isinstance(svc, dict):
        return ""
    retx = svc.get("retransmits")
    naks = sum(v for k, v in svc.items() if k.startswith("naks") and isinstance(v, (int, float)))
    busy = []
    for lc in svc.get("lcores") or []:
        if isinstance(lc, dict):
            b = lc.get("busy_pct", lc.get("busy"))
            if b is None and lc.get("cycles_busy") is not None:
                tot = (lc.get("cycles_busy") or 0) + (lc.get("cycles_idle") or 0)
                b = 100.0 * lc["cycles_busy"] / tot if tot else None
            if b is not None:
                busy.append("%s:%.0f%%" % (lc.get("lcore", "?"), b))
    s = "; retx %s, NAKs %s" % (retx, naks)
    if busy:
        s += ", busy " + " ".join(busy)
    return s


# ---------------------------------------------------------------- table
def verdict(ok):
    return "OK" if ok else "MISS"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, topo, test, result, base="", ratio=None, target=""):
        self.rows.append({
            "topo": topo, "test": test, "result": result, "baseline": base,
            "ratio": ratio, "target": target,
        })


def build_table(recs):
    t = Table()
    failed = {r["id"]: r.get("why", "") for r in recs if r.get("kind") == "step" and r.get("ok") is False}
    parsed = {}
    for r in recs:
        if r.get("kind") in PARSERS:
            parsed[r["id"]] = PARSERS[r["kind"]](r)
    info = {r["id"]: r for r in recs if r.get("kind") == "info"}

    def status(sid):
        """None if the step produced a result, else the row text."""
        p = parsed.get(sid)
        if sid in failed:
            return "FAILED: " + str(failed[sid])[:160]
        if p is None:
            return "not run"
        if "error" in p:
            return ("FAILED: " if "not built" not in p["error"] else "") + p["error"]
        return None

    for topo in ("memif", "af_packet"):
        fr = info.get(topo + ".frames", {})
        data_frame = fr.get("data_frame")
        # Raw baselines of this topology, by frame size.
        raw = {}
        for sid, p in parsed.items():
            r = find(recs, sid)
            if r["kind"] == "testpmd" and r.get("topo") == topo:
                st = status(sid)
                lbl = "raw testpmd %sB frames" % r["frame"]
                if r.get("payload"):
                    lbl += " (%sB payload)" % r["payload"]
                t.add(topo, lbl, st or summary(r, p))
                if st is None:
                    raw[int(r["frame"])] = p
        raw_data = raw.get(int(data_frame)) if data_frame else None
        raw64 = raw.get(64)

        def bw_row(sid, label, gbps_key, target=True):
            st = status(sid)
            if st:
                t.add(topo, label, st, "", None, "FAILED" if st.startswith("FAILED") else "")
                return None
            r = find(recs, sid)
            p = parsed[sid]
            g = gbps_key(p)
            res = summary(r, p)
            if raw_data and raw_data.get("gbps_payload"):
                ratio = g / raw_data["gbps_payload"]
                t.add(topo, label, res, "raw %s %sB frames: %.2f Gb/s payload" % (topo, data_frame, raw_data["gbps_payload"]),
                      ratio, ">=%.2f %s" % (TARGET_BW, verdict(ratio >= TARGET_BW)) if target else "")
            else:
                t.add(topo, label, res, "no raw baseline", None, "")
            return g

        def rate_row(sid, label, mops_key):
            st = status(sid)
            if st:
                t.add(topo, label, st, "", None, "FAILED" if st.startswith("FAILED") else "")
                return None
            r = find(recs, sid)
            p = parsed[sid]
            m = mops_key(p)
            res = summary(r, p)
            if raw64:
                ratio = m / raw64["mpps"]
                t.add(topo, label, res, "raw %s 64B frames: %.3f Mpps" % (topo, raw64["mpps"]), ratio,
                      ">=%.2f %s" % (TARGET_RATE, verdict(ratio >= TARGET_RATE)))
            else:
                t.add(topo, label, res, "no raw baseline", None, "")
            return m

        # perftest
        if find(recs, topo + ".perftest.write_bw_64k"):
            bw_row(topo + ".perftest.write_bw_64k", "ib_write_bw 64KiB 1 QP", lambda p: p["rows"][-1]["gbps"])
        if find(recs, topo + ".perftest.read_bw_64k"):  # no target of its own
            bw_row(topo + ".perftest.read_bw_64k", "ib_read_bw 64KiB 1 QP", lambda p: p["rows"][-1]["gbps"], False)
        if find(recs, topo + ".perftest.write_rate_64"):
            rate_row(topo + ".perftest.write_rate_64", "ib_write_bw 64B -q 8 (msg rate)", lambda p: p["rows"][-1]["mpps"])
        sid = topo + ".perftest.write_bw_sweep"
        if find(recs, sid):
            st = status(sid)
            t.add(topo, "ib_write_bw -a (Gb/s per size)", st or summary(find(recs, sid), parsed[sid]))
        for r in recs:
            if r.get("kind") != "perftest_lat" or r.get("topo") != topo:
                continue
            sid = r["id"]
            st = status(sid)
            label = r.get("label", sid)
            if r.get("retried"):
                label += " (rerun: perftest could not produce a report)"
            if st:
                t.add(topo, label, st, "", None, "FAILED" if st.startswith("FAILED") else "")
                continue
            p = parsed[sid]
            tgt = ""
            if "read_lat" in sid:
                ok = p["t_typical"] <= TARGET_LAT_TYP and p["p999"] <= TARGET_LAT_P999
                tgt = "typ<=%g p99.9<=%g %s" % (TARGET_LAT_TYP, TARGET_LAT_P999, verdict(ok))
            t.add(topo, label, summary(r, p), "", None, tgt)
        # urnic-perf
        one = {}
        for r in recs:
            if r.get("kind") != "uperf" or r.get("topo") != topo:
                continue
            sid = r["id"]
            m = re.search(r"\.uperf\.(\w+?)\.q(\d+)\.t(\d+)\.w(\d+)$", sid)
            if not m:
                continue
            test, q, thr, w = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
            label = r.get("label", sid)
            st = status(sid)
            if st:
                t.add(topo, label, st, "", None, "FAILED" if st.startswith("FAILED") else "")
                continue
            p = parsed[sid]
            val = p["result"].get("gbps", 0) if test == "bw64k" else p["result"].get("mops", 0)
            if q == 1 and thr == 1:
                one[(test, w)] = val
                if test == "bw64k":
                    bw_row(sid, label, lambda p: p["result"].get("gbps", 0))
                else:
                    rate_row(sid, label, lambda p: p["result"].get("mops", 0))
                continue
            base = one.get((test, w))
            if base:
                ratio = val / base
                tgt = ">=%.2f %s" % (TARGET_QP_SCALE, verdict(ratio >= TARGET_QP_SCALE)) if q >= 1024 else ""
                unit = "Gb/s" if test == "bw64k" else "Mops/s"
                t.add(topo, label, summary(r, p), "1 QP (%d wkr): %.3f %s" % (w, base, unit), ratio, tgt)
            else:
                t.add(topo, label, summary(r, p), "no 1-QP run", None, "")
        # Per-packet cost: the sender's worker busy cycles per data packet
        # (1 KiB payload, WRITE 64 KiB on one QP) against testpmd's
        # forwarding cycles per 1082 B frame in the same run (its txonly or
        # rxonly side, whichever printed them).
        sid = topo + ".uperf.bw64k.q1.t1.w1"
        p = parsed.get(sid)
        c = (p or {}).get("cost") or {}
        tp = raw_data.get("cycles_per_pkt") if raw_data else None
        if c.get("send_cycles_per_pkt") and not status(sid):
            res = "send %.0f, recv %.0f busy cycles/pkt (%.0f / %.0f ns)" % (
                c["send_cycles_per_pkt"], c.get("recv_cycles_per_pkt") or 0,
                c.get("send_ns_per_pkt") or 0, c.get("recv_ns_per_pkt") or 0)
            # The data packets carry the path MTU (1 KiB unless the port
            # takes jumbo frames); issue 13's target is for 1 KiB.
            pmtu = int(fr.get("path_mtu") or 1024)
            label = "cost per packet, WRITE %s payload" % (
                "1 KiB" if pmtu == 1024 else "%d B" % pmtu)
            if tp:
                ratio = c["send_cycles_per_pkt"] / tp
                t.add(topo, label, res,
                      "testpmd %s %sB: %.0f cycles/pkt" % (raw_data["cycles_side"], data_frame, tp), ratio,
                      "<=%.2f %s" % (TARGET_COST, verdict(ratio <= TARGET_COST)) if pmtu == 1024 else "")
            else:
                t.add(topo, label, res, "no testpmd cycles", None, "")
        # memory
        mem = []
        for r in recs:
            if r.get("kind") == "memory" and r.get("topo") == topo:
                mem.append(r)
        if mem:
            memory_rows(t, topo, mem, parsed, status)
        # control path: workers that never sleep, then the default idle
        # back-off as a ratio to them (on 2 vCPUs two never-sleeping workers
        # leave the control threads and the application little CPU, so the
        # first is no floor there: perf/control-path runs one service)
        ctl = sorted((r for r in recs if r.get("kind") == "control" and r.get("topo") == topo),
                     key=lambda r: int(r.get("sleep_us", 0)))
        no_sleep = None
        for r in ctl:
            sid, s_us = r["id"], int(r.get("sleep_us", 0))
            label = "control path, %s QPs, worker sleep_us=%d" % (r.get("qps", "?"), s_us)
            st = status(sid)
            if st:
                t.add(topo, label, st, "", None, "FAILED" if st.startswith("FAILED") else "")
                continue
            p = parsed[sid]
            if s_us == 0:
                no_sleep = p["per_qp_us"]
                t.add(topo, label, control_text(p), "both services' workers never sleep")
            else:
                t.add(topo, label, control_text(p),
                      "never sleeping: %.0f us per QP" % no_sleep if no_sleep else "sleep_us=0 not measured",
                      p["per_qp_us"] / no_sleep if no_sleep else None)
    return t, parsed, failed


def memory_rows(t, topo, mem, parsed, status):
    good = {}
    for r in mem:
        sid = r["id"]
        n = int(r["qps"])
        st = status(sid)
        label = "memory %d QPs (%s)" % (n, "urnic-perf --hold" if r.get("tool", "urnic-perf") == "urnic-perf"
                                        else "perftest fallback: ib_write_bw -q N --wait_destroy")
        if st:
            t.add(topo, label, st, "", None, "FAILED" if st.startswith("FAILED") else "")
            continue
        p = parsed[sid]
        a, b, c = p["urnicd_a_rss_pss_kib"], p["urnicd_b_rss_pss_kib"], p.get("app_rss_pss_kib")
        am = p.get("app_memory") or {}
        res = "urnicd server side %.1f MiB RSS / %.1f PSS, client side %.1f / %.1f" % (
            a[0] / 1024, a[1] / 1024, b[0] / 1024, b[1] / 1024)
        if c:
            res += "; client app %.1f MiB RSS" % (c[0] / 1024)
        if am:
            res += "; app's own RSS start %s, device %s, QPs up %s kB; ring_bytes %s" % (
                am.get("rss_kib_start"), am.get("rss_kib_device"), am.get("rss_kib_qps"), am.get("ring_bytes"))
        res += " (set-up %ss)" % r.get("setup_s")
        t.add(topo, label, res)
        good[n] = (a, b, am, c)
    if 1 not in good:
        return
    a1, b1, am1, c1 = good[1]
    for n in sorted(good):
        if n == 1:
            continue
        a, b, am, c = good[n]
        ga = (a[0] - a1[0]) * 1024 / (n - 1)
        gb = (b[0] - b1[0]) * 1024 / (n - 1)
        ring = am.get("ring_bytes") if am else None
        ring_qp = ring / n if ring else 0
        worst = max(ga, gb) - ring_qp
        res = "(RSS(N)-RSS(1))/(N-1): server side %.1f KiB, client side %.1f KiB" % (ga / 1024, gb / 1024)
        if ring:
            t.add(topo, "service bytes/QP beyond rings, %d QPs" % n,
                  res + "; beyond rings (worst side) %.1f KiB" % (worst / 1024),
                  "ring estimate %.1f KiB/QP" % (ring_qp / 1024), None,
                  "<=64KiB %s" % verdict(worst <= TARGET_SVC_PER_QP))
        else:
            # No ring estimate (perftest): the whole growth is an upper bound.
            t.add(topo, "service bytes/QP incl. rings, %d QPs" % n,
                  res + "; worst side %.1f KiB (rings included: no ring estimate)" % (max(ga, gb) / 1024),
                  "", None, "<=64KiB beyond rings: %s" % ("OK even with rings" if max(ga, gb) <= TARGET_SVC_PER_QP
                                                          else "unknown (no ring estimate)"))
        if am and am.get("rss_kib_qps") is not None and am.get("rss_kib_start") is not None:
            grow = (am["rss_kib_qps"] - am["rss_kib_start"]) * 1024
            # Of each QP's shared block only its 4 KiB header page is
            # resident after set-up (the WQE ring pages are touched when
            # used): that page is what RSS holds of "the rings" here.
            resident = min(ring or 0, 4096 * n)
            beyond = grow - resident
            res = ("app RSS growth %.2f MiB (start -> QPs up); rings %.2f MiB of which resident "
                   "%.2f MiB (one 4 KiB header page per QP): beyond %.2f MiB" % (
                       grow / 2**20, (ring or 0) / 2**20, resident / 2**20, beyond / 2**20))
            # urnic-perf's own memory (its buffer, its per-QP state) is in
            # that growth too; the heap the shim kept across ibv_create_qp
            # (mallinfo2, urnic-perf 2026-11-26 on) is the shim's alone.
            lib = am.get("qp_lib_heap_bytes")
            if lib:
                res += ("; of it the shim's heap for the QPs %.2f MiB (%.0f B/QP, mallinfo2 around "
                        "ibv_create_qp; the rest is urnic-perf's own)" % (lib / 2**20, lib / n))
                beyond = lib
            t.add(topo, "app (shim) beyond rings, %d QPs" % n, res,
                  "", None, "<=4MiB %s" % verdict(beyond <= TARGET_SHIM))
        elif c and c1:
            t.add(topo, "client app RSS, %d QPs vs 1" % n,
                  "%.2f MiB more than with 1 QP (%.1f KiB/QP, perftest's own buffers included)" % (
                      (c[0] - c1[0]) / 1024, (c[0] - c1[0]) / (n - 1)), "", None, "")


def fmt_ratio(x, none=""):
    return none if x is None else "%.2f" % x


def render(t, header):
    lines = []
    h = header
    lines.append("urnic benchmark suite: %s %s, host %s, commit %s%s" % (
        h.get("date"), h.get("time"), h.get("host"), h.get("commit"), " (quick)" if h.get("quick") else ""))
    lines.append("CPU: %s, nproc %s; load average start %s, end %s" % (
        h.get("cpu"), h.get("nproc"), h.get("load_start"), h.get("load_end")))
    for k in ("pin_urnicd_a", "pin_urnicd_b", "pin_testpmd", "pin_apps"):
        lines.append("pinning %s: %s" % (k[4:], h.get(k)))
    lines.append("runs: %s; perftest %s, DPDK %s; open files limit %s" % (
        h.get("durations"), h.get("perftest"), h.get("dpdk"), h.get("nofile")))
    for k in ("memif_frames", "af_packet_frames"):
        if h.get(k):
            lines.append(h[k])
    lines.append("ratio = urnic payload Gb/s / raw link payload Gb/s (raw frames/s x RoCE payload bytes per frame),"
                 " or urnic msg/s / raw 64 B frames/s, or N QPs / 1 QP")
    cols = ["topo", "test", "result", "baseline", "ratio", "target"]
    rows = [[r["topo"], r["test"], r["result"], r["baseline"], fmt_ratio(r["ratio"]), r["target"]] for r in t.rows]
    w = [max([len(c)] + [len(x[i]) for x in rows]) for i, c in enumerate(cols)]
    w = [min(x, 110) for x in w]
    lines.append(" | ".join(c.ljust(w[i]) for i, c in enumerate(cols)))
    lines.append("-+-".join("-" * x for x in w))
    for x in rows:
        lines.append(" | ".join(x[i].ljust(w[i]) for i in range(len(cols))).rstrip())
    return "\n".join(lines)


MD_HEADER = """# urnic benchmark suite results

One row per `perf/run-suite` run (the full numbers, with every command line,
are in the JSON file named in the last column, under perf/results/).

- **mode**: full or quick (`--quick`: short smoke durations, not comparable),
  plus the `--only` filters if any.
- **raw memif**: dpdk-testpmd txonly -> rxonly over net_memif with frames of a
  full-MTU RDMA WRITE middle packet (Eth+IPv4+UDP+BTH+payload+ICRC),
  in Gb/s of RoCE payload carried by those frames.
- **write_bw**: `ib_write_bw -s 65536` through the shim on memif, Gb/s, and
  its ratio to raw memif (target >= 0.90).
- **rate**: `ib_write_bw -s 64 -q 8` Mmsg/s and the ratio to raw 64 B
  frames/s (target >= 0.50).
- **read_lat**: `ib_read_lat -s 2` typical / p99.9 us, best of the four
  variants (-e or polling, idle sleep 0 or 50 us) (targets <= 3 / <= 10).
- **1024/1**: urnic-perf WRITE 64 KiB, 1024 QPs aggregate over 1 QP, one
  worker (target >= 0.80).
- **svc/QP**, **shim**: urnicd RSS growth per QP beyond the ring estimate
  (target <= 64 KiB) and the application's RSS growth beyond rings at the
  largest QP count measured (target <= 4 MiB).
- **failed**: steps that failed (see the JSON).

| date | host | commit | mode | CPU x nproc | load start/end | raw memif Gb/s | write_bw Gb/s (ratio) | rate Mmsg/s (ratio) | read_lat typ/p99.9 us | 1024/1 | svc/QP KiB | shim MiB | failed | json |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def md_row(t, header, failed, json_path):
    def find_row(pred):
        for r in t.rows:
            if pred(r):
                return r
        return None

    def cell(r, fmt_res):
        if r is None:
            return "-"
        if r["result"].startswith("FAILED"):
            return "FAILED"
        if r["result"].startswith("urnic-perf: not built"):
            return "not built"
        return fmt_res(r)

    raw = find_row(lambda r: r["topo"] == "memif" and r["test"].startswith("raw testpmd") and "payload)" in r["test"]
                   and "(64B payload)" not in r["test"])
    num = lambda s, pat: (re.search(pat, s) or [None, "?"])[1]
    c_raw = cell(raw, lambda r: num(r["result"], r"([\d.]+) Gb/s RoCE payload"))
    bw = find_row(lambda r: r["topo"] == "memif" and r["test"] == "ib_write_bw 64KiB 1 QP")
    c_bw = cell(bw, lambda r: "%s (%s)" % (num(r["result"], r"([\d.]+) Gb/s"), fmt_ratio(r["ratio"], "no raw")))
    rate = find_row(lambda r: r["topo"] == "memif" and r["test"].startswith("ib_write_bw 64B"))
    c_rate = cell(rate, lambda r: "%s (%s)" % (num(r["result"], r"([\d.]+) Mpps"), fmt_ratio(r["ratio"], "no raw")))
    lats = [r for r in t.rows if r["topo"] == "memif" and r["test"].startswith("ib_read_lat") and r["result"].startswith("typical")]
    if lats:
        best = min(lats, key=lambda r: float(num(r["result"], r"typical ([\d.]+)")))
        c_lat = "%s / %s (%s)" % (num(best["result"], r"typical ([\d.]+)"), num(best["result"], r"p99.9 ([\d.]+)"),
                                  best["test"].replace("ib_read_lat 2B ", ""))
    else:
        c_lat = "-"
    sc = find_row(lambda r: r["topo"] == "memif" and "bw 1024 QP 1 thr 1 wkr" in r["test"])
    c_sc = cell(sc, lambda r: fmt_ratio(r["ratio"], "-"))
    svc = [r for r in t.rows if r["test"].startswith("service bytes/QP")]
    c_svc = num(svc[-1]["result"], r"(?:beyond rings \(worst side\)|worst side) ([-\d.]+)") if svc else "-"
    if svc and "incl. rings" in svc[-1]["test"]:
        c_svc += " incl. rings"
    shim = [r for r in t.rows if r["test"].startswith("app (shim)")]
    c_shim = num(shim[-1]["result"], r"beyond ([-\d.]+) MiB") if shim else "-"
    h = header
    cpu = "%s x%s" % (h.get("cpu"), h.get("nproc"))
    c_failed = str(len(failed)) if failed else "0"
    return "| %s | %s | %s | %s | %s | %s / %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
        h.get("date"), h.get("host"), h.get("commit"),
        ("quick" if h.get("quick") else "full") + (" --only " + h["only"] if h.get("only") else ""), cpu,
        h.get("load_start"), h.get("load_end"), c_raw, c_bw, c_rate, c_lat, c_sc, c_svc, c_shim, c_failed,
        os.path.basename(json_path))


def build(path, out_json, out_md):
    recs = load_records(path)
    info = {r["id"]: r for r in recs if r.get("kind") == "info"}
    header = dict(info.get("header", {}))
    header.update({k: v for k, v in info.get("footer", {}).items() if k not in ("id", "kind")})
    for topo in ("memif", "af_packet"):
        fr = info.get(topo + ".frames")
        if fr:
            header[topo + "_frames"] = (
                "%s: port MTU %s, RoCE path MTU %s: a WRITE middle packet is a %s B frame on the wire "
                "(Eth 14 + IPv4 20 + UDP 8 + BTH 12 + %s + ICRC 4; first/only packets add RETH 16), "
                "a 64 B WRITE_ONLY is %s B" % (topo, fr.get("port_mtu"), fr.get("path_mtu"), fr.get("data_frame"),
                                              fr.get("path_mtu"), fr.get("rate_frame")))
    if info.get("memif.mtu"):
        m = info["memif.mtu"]
        header["memif_mtu_probe"] = "tried port.mtu %s, got %s (%s)" % (m.get("tried"), m.get("port_mtu"), m.get("log"))
    t, parsed, failed = build_table(recs)
    text = render(t, header)
    print(text)
    steps = []
    for r in recs:
        if r.get("kind") in PARSERS:
            s = dict(r)
            s["parsed"] = parsed.get(r["id"])
            s["failed"] = failed.get(r["id"])
            for k in ("log", "log_server", "log_tx"):
                if r.get(k):
                    s[k + "_tail"] = tail(r[k])
            steps.append(s)
    doc = {
        "suite": "urnic perf/run-suite",
        "version": 1,
        "header": header,
        "info": [r for r in recs if r.get("kind") == "info"],
        "failures": [r for r in recs if r.get("kind") == "step"],
        "steps": steps,
        "table": t.rows,
        "targets": {
            "bw_ratio": TARGET_BW, "rate_ratio": TARGET_RATE, "read_lat_typical_us": TARGET_LAT_TYP,
            "read_lat_p999_us": TARGET_LAT_P999, "qp_scale_1024": TARGET_QP_SCALE,
            "service_bytes_per_qp_beyond_rings": TARGET_SVC_PER_QP, "shim_bytes_beyond_rings": TARGET_SHIM,
        },
        "table_text": text,
    }
    with open(out_json, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    if not os.path.exists(out_md):
        with open(out_md, "w") as f:
            f.write(MD_HEADER)
    with open(out_md, "a") as f:
        f.write(md_row(t, header, failed, out_json))
    return 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "add":
        add(argv[1], argv[2:])
        return 0
    if len(argv) == 3 and argv[0] in ("check", "show"):
        recs = load_records(argv[1])
        r = find(recs, argv[2])
        if r is None:
            print("no record")
            return 1
        p = PARSERS[r["kind"]](r)
        if argv[0] == "check":
            if "error" in p:
                print(p["error"])
                return 1
            return 0
        print(summary(r, p))
        return 0
    if len(argv) == 6 and argv[0] == "build" and argv[2] == "--json" and argv[4] == "--md":
        return build(argv[1], argv[3], argv[5])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
