// The cpu_amx product of Q8_0 / Q4_0 weights with Q8_0 activations, written once over
// a tile policy P (the real instructions or the emulator) and included by
// kernels_amx.cpp and kernels_emu.cpp.
//
// Tiles: tmm0..tmm3 the int32 products C[i][j] (16 activation rows x 16 weight rows),
// tmm4 / tmm5 two A tiles (16 activation rows x one 32-byte block, 512 contiguous
// bytes: see Job), tmm6 / tmm7 two B tiles (8 rows x 64 bytes: one block of 16 weight
// rows in VNNI order). Per block,
// each C tile starts at zero and takes one TDPBSSD (exact: |sum| <= 32 * 128 * 128),
// is stored, and its int32 results are scaled into float accumulators in the
// reference's order (cpu_scalar's dot_q8_0 / dot_q4_0: blocks in order, starting at
// 0; Q8_0 adds float(s) * (dw * dy), Q4_0 (float(s) * dw) * dy; no FMA), so every
// output is cpu_scalar's bit for bit, whatever the tiling or the thread split.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>

#include "kernels.h"
#include "tile.h"

// Everything here has internal linkage (an unnamed namespace): the two builds are
// compiled with different ISA flags, and a function shared by name between them could
// be merged by the linker into the AVX-512 build's copy, reached from the emulated
// path on a CPU without AVX-512. For the same reason no standard-library template is
// instantiated here (the scratch buffer is managed by hand).
namespace tessera::cpu_amx::kern::impl {
namespace {

inline tile::Config kernel_config() {
  tile::Config c;
  c.palette_id = 1;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;      // C
  for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = kBlock;  // A
  for (int t = 6; t < 8; ++t) c.rows[t] = 8, c.colsb[t] = 64;       // B
  return c;
}

// Blocks between a C tile's store and its scaling (run_rows), as docs/amx.md chose it.
constexpr int kLag = 2;

// Per thread: the B tiles of the current weight tiles (Q4_0 unpacked, Q8_0 copied to
// 64-byte alignment: in the repacked copy they start 32 bytes into a line), the C
// tiles as stored, and the float accumulators of 32 activation rows x 32 weight rows.
struct Scratch {
  int8_t* bt = nullptr;  // [2][nb][8][64], 64-byte aligned
  size_t bt_bytes = 0;
  int8_t* reserve_bt(size_t bytes) {
    if (bytes > bt_bytes) {
      std::free(bt);
      bt_bytes = (bytes + 4095) & ~size_t(4095);
      bt = static_cast<int8_t*>(std::aligned_alloc(64, bt_bytes));
      if (!bt) bt_bytes = 0;
    }
    return bt;
  }
  ~Scratch() { std::free(bt); }
  alignas(64) int32_t c[kLag][4][16 * 16];  // the last kLag blocks' C tiles (see run_rows)
  alignas(64) float acc[32 * 32];
};
inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// One block's tile work: the B and A tiles loaded, each C tile zeroed and given its
// TDPBSSD. The results are stored later (see run_rows), so that the tile unit works
// on block b + 1 while the vector units scale block b.
template <class P, int NT, int MT>
inline void issue_block(const int8_t* b0, const int8_t* b1, const int8_t* a0, const int8_t* a1) {
  P::template load<6>(b0, 64);
  if constexpr (NT > 1) P::template load<7>(b1, 64);
  P::template load<4>(a0, kBlock);
  if constexpr (MT > 1) P::template load<5>(a1, kBlock);
  P::template zero<0>();
  P::template dp<0, 4, 6>();
  if constexpr (NT > 1) {
    P::template zero<1>();
    P::template dp<1, 4, 7>();
  }
  if constexpr (MT > 1) {
    P::template zero<2>();
    P::template dp<2, 5, 6>();
    if constexpr (NT > 1) {
      P::template zero<3>();
      P::template dp<3, 5, 7>();
    }
  }
}
template <class P, int NT, int MT>
inline void store_block(int32_t (*c)[256]) {
  P::template store<0>(c[0], 64);
  if constexpr (NT > 1) P::template store<1>(c[1], 64);
  if constexpr (MT > 1) {
    P::template store<2>(c[2], 64);
    if constexpr (NT > 1) P::template store<3>(c[3], 64);
  }
}

// Up to 32 activation rows from m0 (MT A tiles) times NT weight tiles, all blocks,
// into acc (32 x 32 floats, row m at acc + 32 m, weight tile jj at + 16 jj).
template <class P, int NT, int MT, bool Q4>
void run_rows(const Job& j, int64_t m0, const uint8_t* const* wt, const int8_t* bt, int64_t nb, int64_t TB,
              Scratch& s) {
  const int8_t* a0 = j.q + (m0 / 16) * nb * 512;  // A tiles of rows m0.. and m0 + 16..
  const int8_t* a1 = a0 + nb * 512;
  auto issue = [&](int64_t b) {
    issue_block<P, NT, MT>(bt + b * 512, bt + (nb + b) * 512, a0 + b * 512, a1 + b * 512);
  };
  int rows[2];
  for (int i = 0; i < MT; ++i) rows[i] = int(std::min<int64_t>(16, j.M - (m0 + 16 * i)));
  std::memset(s.acc, 0, sizeof s.acc);
  auto post = [&](int64_t b) {  // scale block b's stored C tiles into acc
    int32_t(*c)[256] = s.c[b % kLag];
    for (int i = 0; i < MT; ++i) {
      const float* dy = j.d + (m0 + 16 * i) * j.ldd + b;
      for (int jj = 0; jj < NT; ++jj)
        P::template scale<Q4>(c[2 * i + jj], reinterpret_cast<const uint16_t*>(wt[jj] + b * TB), dy, j.ldd, rows[i],
                              s.acc + (16 * i) * 32 + 16 * jj, 32);
    }
  };
  // Software pipeline: while the tile unit stores block b and computes block b + 1,
  // the vector units scale block b - LAG, whose stores had LAG - 1 iterations to
  // complete (its loads would otherwise wait for them).
  issue(0);
  for (int64_t b = 0; b < nb; ++b) {
    store_block<P, NT, MT>(s.c[b % kLag]);
    if (b + 1 < nb) issue(b + 1);
    if (b >= kLag - 1) post(b - (kLag - 1));
  }
  for (int64_t b = std::max<int64_t>(0, nb - (kLag - 1)); b < nb - 1; ++b) post(b);
  post(nb - 1);
}

template <class P, bool Q4>
void matmul_tiles_t(const Job& j, int64_t t0, int64_t t1) {
  const int64_t nb = j.K / kBlock, TB = tile_block_bytes(j.wt);
  const int64_t mp = (j.M + 15) / 16 * 16;  // rows the A tiles read
  Scratch& s = scratch();
  int8_t* bt = s.reserve_bt(size_t(2 * nb * 512));
  if (!bt) {  // a few hundred KiB per thread: never expected, never silently skipped
    std::fputs("cpu_amx: out of memory for the B tiles\n", stderr);
    std::abort();
  }
  P::configure(kernel_config());
  for (int64_t t = t0; t < t1; t += 2) {
    const int nt = int(std::min<int64_t>(2, t1 - t));
    const uint8_t* wt[2] = {j.w + size_t(t * nb * TB), j.w + size_t((t + 1) * nb * TB)};
    // The B tiles of both weight tiles, once for all activation rows. Q4_0: rows 0-3 the
    // low nibbles of vectors 0-3 (weights 4g..), rows 4-7 the high ones (16 + 4g..), minus 8.
    for (int jj = 0; jj < nt; ++jj)
      for (int64_t b = 0; b < nb; ++b) {
        if (Q4)
          P::unpack_q4(wt[jj] + b * TB + 32, bt + (jj * nb + b) * 512);
        else
          std::memcpy(bt + (jj * nb + b) * 512, wt[jj] + b * TB + 32, 512);
      }
    for (int64_t m0 = 0; m0 < mp; m0 += 32) {
      const int mt = int(std::min<int64_t>(2, (mp - m0) / 16));
      if (nt == 2 && mt == 2) run_rows<P, 2, 2, Q4>(j, m0, wt, bt, nb, TB, s);
      else if (nt == 2) run_rows<P, 2, 1, Q4>(j, m0, wt, bt, nb, TB, s);
      else if (mt == 2) run_rows<P, 1, 2, Q4>(j, m0, wt, bt, nb, TB, s);
      else run_rows<P, 1, 1, Q4>(j, m0, wt, bt, nb, TB, s);
      const int64_t rows_here = std::min<int64_t>(32, j.M - m0);
      for (int64_t m = 0; m < rows_here; ++m) {
        float* o = j.out_ptr ? j.out_ptr[m0 + m] : j.out + (m0 + m) * j.out_stride;  // (not Job::out_row: see above)
        for (int jj = 0; jj < nt; ++jj) {
          const int64_t n0 = (t + jj) * kTileRows, cnt = std::min<int64_t>(kTileRows, j.N - n0);
          if (cnt > 0) std::memcpy(o + n0, s.acc + m * 32 + 16 * jj, size_t(cnt) * sizeof(float));
        }
      }
    }
  }
  P::release();
}

template <class P>
void matmul_tiles(const Job& j, int64_t t0, int64_t t1) {
  if (j.wt == DType::Q4_0)
    matmul_tiles_t<P, true>(j, t0, t1);
  else
    matmul_tiles_t<P, false>(j, t0, t1);
}

}  // namespace
}  // namespace tessera::cpu_amx::kern::impl
