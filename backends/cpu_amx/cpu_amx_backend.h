// cpu_amx: AMX tile products for many activation rows (prefill, batched decode,
// mixture-of-experts groups) on top of the AVX-512 backend.
//
// The backend wraps a cpu_avx512 backend and accepts exactly the nodes it accepts
// (what cpu_avx512 declines goes to the next backend by rank). MatMul nodes with
// Q8_0 / Q4_0 weights and at least `min_columns` activation rows, and MatMulId nodes
// with as many (token, expert) pairs, run on the tiles; every other node, and every
// run of them, goes to the wrapped backend in one call, so one-token decode is
// cpu_avx512's own path. Wrapping rather than declining is deliberate: only the
// best-ranked backend gets to repack weights (decision 4), so a cpu_amx that declined
// small products would leave the decode products of a cpu_avx512 after it without its
// repacked tiles. cpu_amx and cpu_avx512 are one plugin family sharing a kernel
// library (tessera_cpu_avx512_ops, linked statically); neither links cpu_scalar.
// Where AVX-512 is missing (the tile emulator on another CPU) there is nothing to
// wrap: cpu_amx then accepts only the tile products and declines every other node.
//
// The tile products read cpu_avx512's repacked Q8_0 / Q4_0 copy (its layout is the
// VNNI B-tile layout), found through the wrapped backend's weight_bytes() and checked
// at load; without one (repack off, no AVX-512) cpu_amx keeps its own copy.
// Results equal cpu_scalar's bit for bit (see kernel_impl.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cpu_avx512_backend.h"
#include "tessera/backend.h"
#include "tessera/pool_ref.h"

namespace tessera::cpu_amx {

// True when this CPU and OS run AMX (CPUID AMX-TILE, AMX-INT8 and AMX-BF16; XCR0
// bits 17-18; Linux's arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) permission);
// otherwise *why names what is missing. Safe on any x86-64 CPU.
bool hardware_usable(std::string* why = nullptr);

// TESSERA_AMX_EMULATE is set to 1 (or true / yes / on).
bool emulation_requested_by_env();

struct Options {
  bool emulate = false;       // the tile emulator instead of the instructions
  int64_t min_columns = 16;   // fewest activation rows (MatMulId: pairs) a tile product takes
  // false: wrap nothing even where AVX-512 is usable, as cpu_amx runs without AVX-512
  // (tile products only, the rest declined); for tests of that path.
  bool wrap_avx512 = true;
  // Passed to the wrapped cpu_avx512.
  cpu_avx512::Options avx512;
};

// Throws tessera::Error when neither emulation is asked for nor the hardware usable,
// or min_columns < 1.
std::unique_ptr<Backend> make_backend(PoolRef pool, const Options& options);

}  // namespace tessera::cpu_amx
