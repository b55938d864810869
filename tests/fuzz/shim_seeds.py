#!/usr/bin/python3
"""Writes seed programs for tests/fuzz/fuzz_shim.cc (its header comment has
the format; keep the two in step): two clients that open, allocate a PD, a
CQ, QPs, MRs, connect the QPs and move data (RDMA WRITE, SEND into a posted
receive, RDMA READ, an atomic), an SRQ, a completion channel, a UD QP with an
AH, a UD QP in a multicast group (destroyed while attached, detached, left
attached at close), hostile ring headers, requests with each other's handles
and a service shutdown with QPs live.
usage: shim_seeds.py OUT_DIR"""
import os
import struct
import sys

REQ, CLOSE, SCRIBBLE, RUN, PUMP = 0, 10, 11, 13, 14
OPEN, QUERY_PORT, ALLOC_PD, DEALLOC_PD, REG_MR, DEREG_MR = range(6)
CREATE_CHANNEL, DESTROY_CHANNEL, CREATE_CQ, DESTROY_CQ = range(6, 10)
CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ, DESTROY_SRQ = range(10, 14)
CREATE_QP, MODIFY_QP, QUERY_QP, DESTROY_QP, CREATE_AH = range(14, 19)
ATTACH_MCAST, DETACH_MCAST = 24, 25
INIT, RTR, RTS = 1, 2, 3
RC, UD = 0, 200


def u16(v):
    return struct.pack('<H', v)


def u32(v):
    return struct.pack('<I', v)


def u64(v):
    return struct.pack('<Q', v)


def mine(i=0):  # a handle of this client's (index in the order created)
    return bytes([0, i])


def other(i=0):  # one of the other client's
    return bytes([6, i])


def req(c, op, body=b'', shape=0):
    return bytes([REQ, c, op, shape]) + body


def open_(c):
    return req(c, OPEN, b'\0')


def reg_mr(c, pd=mine(), page=0, access=0x0f):
    # One sealed one-page memfd at 0x10000 << page.
    return req(c, REG_MR, pd + bytes([access, 0, 0, 0x66, page, 0]))


def create_cq(c, cqe=64, channel=None):
    return req(c, CREATE_CQ, bytes([cqe]) +
               (b'\1' + channel if channel else b'\0'))


def create_qp(c, pd=mine(), cq=mine(), t=RC, srq=None, wr=16):
    return req(c, CREATE_QP, pd + cq + b'\1' +
               (b'\0' + srq if srq else b'\1') +
               bytes([t, 1, wr, 0 if srq else wr, 2, 2, 64]))


def modify(c, qp, state, dest=0, ud=False):
    how = state | (0x40 if ud else 0)
    b = mine(qp) + bytes([how])
    if state == INIT:
        b += bytes([0x0f]) + u32(0x11111111)
    elif state == RTR:
        b += bytes([2, dest]) + u32(0) + bytes([1, 12, 1])
    elif state == RTS:
        b += bytes([14, 7, 7]) + u32(0) + bytes([1])
    return req(c, MODIFY_QP, b)


def connect(c, a, b):
    return (modify(c, a, INIT) + modify(c, b, INIT) +
            modify(c, a, RTR, b) + modify(c, b, RTR, a) +
            modify(c, a, RTS) + modify(c, b, RTS))


def sge(mr, off=0, length=64):
    return bytes([mr]) + u16(off) + u16(length)


def send_wqe(c, qp, opcode, src, dst, flags=2, remote_qp=0):
    # wr_id, opcode, send_flags, num_sge, the SGE, the remote SGE, remote
    # address from it, compare_add, swap, imm, ah (none), remote QP, qkey,
    # bind_lkey.
    return (bytes([SCRIBBLE, c, 0, qp, 7, opcode, flags, 1]) + src + dst +
            b'\1' + u64(0) + u64(0) + u32(0) + bytes([7]) +
            bytes([remote_qp]) + u32(0x11111111) + u32(0))


def recv_wqe(c, qp, dst):
    return bytes([SCRIBBLE, c, 2, 9, 1]) + dst + bytes([0, qp])


def basic(c):
    return (open_(c) + req(c, ALLOC_PD) + create_cq(c) + create_qp(c) +
            create_qp(c) + reg_mr(c, page=0) + reg_mr(c, page=1) +
            connect(c, 0, 1))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {}
    # RDMA WRITE, SEND into a posted receive, READ, fetch-and-add.
    seeds['rc_data'] = (b'\2' + basic(0) +
                        send_wqe(0, 0, 0, sge(0), sge(1, 0, 4096)) +
                        recv_wqe(0, 1, sge(1, 128, 256)) +
                        send_wqe(0, 0, 2, sge(0, 0, 100), sge(1)) +
                        send_wqe(0, 0, 4, sge(1, 0, 512), sge(0)) +
                        send_wqe(0, 0, 6, sge(0, 0, 8), sge(1, 0, 8)) +
                        bytes([RUN, PUMP]) +
                        req(0, QUERY_QP, mine(0)) +
                        modify(0, 0, 0) + modify(0, 1, 0) +
                        connect(0, 0, 1))
    # Two clients, each with its own objects, then each other's handles,
    # destroys in the wrong order and a close in the middle.
    seeds['two_clients'] = (b'\0' + basic(0) + open_(1) +
                            req(1, ALLOC_PD) + create_cq(1) +
                            create_qp(1, pd=other(), cq=other()) +
                            req(1, DEALLOC_PD, other()) +
                            req(0, DEALLOC_PD, mine()) +
                            req(0, DESTROY_CQ, mine()) +
                            req(1, DESTROY_QP, other(1)) +
                            req(1, DEREG_MR, other()) +
                            bytes([CLOSE, 0]) + basic(0) +
                            send_wqe(0, 0, 0, sge(0), sge(1)) +
                            bytes([CLOSE, 1]))
    # An SRQ, a completion channel armed, a UD QP with an AH, tight limits.
    seeds['srq_ud_limits'] = (b'\1' + open_(0) + req(0, ALLOC_PD) +
                              req(0, CREATE_CHANNEL, b'\1\1') +
                              create_cq(0, 16, mine()) +
                              req(0, CREATE_SRQ, mine() + bytes([8, 1, 2])) +
                              create_qp(0, srq=mine()) +
                              create_qp(0, t=UD) +
                              req(0, CREATE_AH, mine() + b'\1') +
                              reg_mr(0) + reg_mr(0, page=2) +
                              modify(0, 1, INIT, ud=True) +
                              modify(0, 1, RTR, ud=True) +
                              modify(0, 1, RTS, ud=True) +
                              bytes([SCRIBBLE, 0, 4, 0, 1]) +
                              send_wqe(0, 1, 2, sge(0, 0, 64), sge(1)) +
                              req(0, DESTROY_CHANNEL, mine()) +
                              req(0, DESTROY_SRQ, mine()))
    # A UD QP joins group 239.0.0.1 (and an RC QP tries), a destroy while
    # attached, a detach, a second join left for the close to undo.
    seeds['multicast'] = (b'\0' + open_(0) + req(0, ALLOC_PD) + create_cq(0) +
                          create_qp(0, t=UD) + create_qp(0) +
                          modify(0, 0, INIT, ud=True) +
                          modify(0, 0, RTR, ud=True) +
                          modify(0, 0, RTS, ud=True) +
                          req(0, ATTACH_MCAST, mine(0) + b'\1') +
                          req(0, ATTACH_MCAST, mine(1) + b'\1') +
                          req(0, DESTROY_QP, mine(0)) +
                          req(0, DETACH_MCAST, mine(0) + b'\1') +
                          req(0, ATTACH_MCAST, mine(0) + b'\2') +
                          bytes([RUN, CLOSE, 0]))
    # Hostile ring headers and a forged doorbell page.
    seeds['hostile_rings'] = (b'\0' + basic(0) +
                              bytes([SCRIBBLE, 0, 3, 0xff, 0]) + u32(1 << 30) +
                              u32(1 << 30) + u32(0) + u32(1 << 20) +
                              u32(1 << 20) + u32(5) + u32(99) +
                              bytes([SCRIBBLE, 0, 5, 0xf]) + u32(1) +
                              bytes([3]) + u64(2**64 - 1) + u16(3) +
                              u64(2**64 - 1) + u32(0) +
                              send_wqe(0, 1, 0, sge(0), sge(1)))
    for name, data in seeds.items():
        with open(os.path.join(out, name), 'wb') as f:
            f.write(data)


if __name__ == '__main__':
    main()
