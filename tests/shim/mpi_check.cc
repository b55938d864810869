// mpi_check: a two-rank MPI program whose every byte is checked, for
// tests/integration/ucx.sh (Open MPI, pml ucx, over urnic): a ping-pong of
// messages from 1 B to 4 MiB and MPI_Allreduce of 1 to 1 Mi doubles. Rank 0
// prints the round-trip time per size. Exit 0 only if every message and
// every reduction held exactly what was expected.
// The C API only (Open MPI's C++ bindings do not build warning-free).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// The byte at `i` of message `iter` of `size` bytes sent by `rank`.
uint8_t pattern(int rank, int iter, size_t size, size_t i) {
  return static_cast<uint8_t>((i * 131 + size * 7 + iter * 29 + rank * 101) ^
                              (i >> 8));
}

int check_bytes(const std::vector<uint8_t>& buf, int rank, int iter,
                size_t size) {
  for (size_t i = 0; i < size; ++i)
    if (buf[i] != pattern(rank, iter, size, i)) {
      std::fprintf(stderr,
                   "mpi_check: size %zu iteration %d: byte %zu is %u, "
                   "expected %u\n",
                   size, iter, i, buf[i], pattern(rank, iter, size, i));
      return 1;
    }
  return 0;
}

int ping_pong(int rank, int iters) {
  int bad = 0;
  const int peer = 1 - rank;
  for (size_t size = 1; size <= (4u << 20); size *= 4) {
    std::vector<uint8_t> out(size), in(size);
    const double t0 = MPI_Wtime();
    for (int it = 0; it < iters; ++it) {
      if (rank == 0) {
        for (size_t i = 0; i < size; ++i) out[i] = pattern(0, it, size, i);
        MPI_Send(out.data(), static_cast<int>(size), MPI_BYTE, peer, it,
                 MPI_COMM_WORLD);
        MPI_Recv(in.data(), static_cast<int>(size), MPI_BYTE, peer, it,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        bad |= check_bytes(in, 1, it, size);
      } else {
        MPI_Recv(in.data(), static_cast<int>(size), MPI_BYTE, peer, it,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        bad |= check_bytes(in, 0, it, size);
        for (size_t i = 0; i < size; ++i) out[i] = pattern(1, it, size, i);
        MPI_Send(out.data(), static_cast<int>(size), MPI_BYTE, peer, it,
                 MPI_COMM_WORLD);
      }
    }
    if (rank == 0)
      std::printf("pingpong %8zu B x %d: %.1f us per round trip\n", size, iters,
                  (MPI_Wtime() - t0) * 1e6 / iters);
  }
  return bad;
}

int allreduce(int rank, int nranks) {
  int bad = 0;
  for (int n = 1; n <= (1 << 20); n *= 16) {
    std::vector<double> in(n), out(n);
    for (int i = 0; i < n; ++i) in[i] = (rank + 1) * 1000.0 + i;
    MPI_Allreduce(in.data(), out.data(), n, MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
    // Every term is an integer below 2^53: the sum is exact in any order.
    const double ranks_sum = nranks * (nranks + 1) / 2 * 1000.0;
    for (int i = 0; i < n; ++i)
      if (out[i] != ranks_sum + static_cast<double>(nranks) * i) {
        std::fprintf(stderr, "mpi_check: allreduce of %d: [%d] is %.1f\n", n, i,
                     out[i]);
        bad = 1;
        break;
      }
    if (rank == 0) std::printf("allreduce %7d doubles: ok=%d\n", n, !bad);
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks != 2) {
    if (rank == 0) std::fprintf(stderr, "mpi_check: needs 2 ranks\n");
    MPI_Finalize();
    return 2;
  }
  int bad = ping_pong(rank, argc > 1 ? std::atoi(argv[1]) : 20);
  bad |= allreduce(rank, nranks);
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("mpi_check: %s\n", any ? "FAILED" : "all data checked");
  MPI_Finalize();
  return any ? 1 : 0;
}
