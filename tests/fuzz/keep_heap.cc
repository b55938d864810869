// Linked into the fuzz targets whose every input builds and frees a service
// or engines (fuzz_shim, fuzz_engine, fuzz_cm). With glibc's defaults the
// engines' 128 KiB timer wheels are mapped, faulted and unmapped afresh for
// each input, and the freed top of the heap goes back to the kernel (brk)
// for the next input to fault in again; page faults are dear in this VM.
// Kept on the heap instead, as the GLIBC_TUNABLES of tests/fuzz/README.md's
// measurement: 256 KiB, not more (a 32 MiB threshold made real inputs
// slower there: big zeroed blocks memset on the heap, where fresh pages cost
// only those touched). fuzz_shim, 8 000 runs from the seeds, -seed=7, two
// rounds (2026-11-29): 11.9 / 12.6 s with the defaults, 8.9 / 9.7 s so,
// 9.4 / 10.1 s with a 64 MiB threshold. ASan's allocator ignores mallopt:
// this changes only the UBSan-only builds of the long runs.
#include <malloc.h>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return 0;
}
