// The tile emulator: the Intel SDM's pseudocode for the AMX instructions cpu_amx uses,
// in plain C++ (compiled without ISA flags; runs on any x86-64 CPU). Faults the
// hardware raises are thrown as tessera::Error with the instruction and the reason.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "tile.h"
#include "tessera/error.h"

namespace tessera::cpu_amx::tile {

namespace {

std::string tmm(int t) { return "tmm" + std::to_string(t); }

uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Denormal (nonzero, exponent field 0) -> zero of the same sign: DAZ on inputs, FTZ
// on results.
float flush(float x) {
  const uint32_t u = f2u(x);
  return (u & 0x7F800000u) == 0 ? u2f(u & 0x80000000u) : x;
}
bool is_nan(float x) { return (f2u(x) & 0x7FFFFFFFu) > 0x7F800000u; }
float quiet(float x) { return u2f(f2u(x) | 0x00400000u); }
constexpr uint32_t kDefaultNaN = 0xFFC00000u;  // x86's "real indefinite"

}  // namespace

const char* dp_name(Dp k) {
  switch (k) {
    case Dp::SS: return "TDPBSSD";
    case Dp::SU: return "TDPBSUD";
    case Dp::US: return "TDPBUSD";
    case Dp::UU: return "TDPBUUD";
  }
  return "TDPB?";
}

// LDTILECFG's checks for palette 1 (SDM: palette_id above the largest palette, a
// nonzero reserved byte or reserved tile entry, or a tile with more rows or bytes per
// row than the palette allows raise #GP). A tile with rows but no bytes per row (or
// the reverse) is rejected as well: the SDM requires both zero (tile unused) or both
// nonzero, and so does the hardware (tested in test_cpu_amx where it exists).
std::string check_config(const Config& cfg) {
  if (cfg.palette_id == 0) return {};
  if (cfg.palette_id > 1) return "palette_id " + std::to_string(cfg.palette_id) + " is not supported (largest: 1)";
  for (int i = 0; i < 14; ++i)
    if (cfg.reserved0[i]) return "reserved byte " + std::to_string(2 + i) + " is not zero";
  for (int i = kTiles; i < 16; ++i)
    if (cfg.colsb[i] || cfg.rows[i]) return "tile entry " + std::to_string(i) + " is reserved but not zero";
  for (int i = 0; i < kTiles; ++i) {
    if (cfg.rows[i] > kMaxRows)
      return tmm(i) + ": " + std::to_string(cfg.rows[i]) + " rows (at most " + std::to_string(kMaxRows) + ")";
    if (cfg.colsb[i] > kMaxColsb)
      return tmm(i) + ": " + std::to_string(cfg.colsb[i]) + " bytes per row (at most " + std::to_string(kMaxColsb) + ")";
    if ((cfg.rows[i] == 0) != (cfg.colsb[i] == 0))
      return tmm(i) + ": rows and bytes per row must both be zero or both nonzero";
  }
  return {};
}

Emulator::Emulator() { std::memset(t_, 0, sizeof t_); }

void Emulator::ldtilecfg(const Config& cfg) {
  if (const std::string why = check_config(cfg); !why.empty()) throw Error("LDTILECFG: #GP: " + why);
  std::memset(t_, 0, sizeof t_);  // loading a configuration zeroes the tile data
  if (cfg.palette_id == 0) {
    cfg_ = Config{};
    configured_ = false;
    return;
  }
  cfg_ = cfg;
  cfg_.start_row = 0;
  configured_ = true;
}

void Emulator::release() {
  std::memset(t_, 0, sizeof t_);
  cfg_ = Config{};
  configured_ = false;
}

void Emulator::need_configured(const char* insn) const {
  if (!configured_) throw Error(std::string(insn) + ": #UD: tiles are not configured (LDTILECFG first)");
}

void Emulator::loadd(int t, const void* base, int64_t stride) {
  need_configured("TILELOADD");
  if (t < 0 || t >= kTiles) throw Error("TILELOADD: no tile " + std::to_string(t));
  const int rows = cfg_.rows[t], colsb = cfg_.colsb[t];
  uint8_t* d = t_[t];
  std::memset(d, 0, kTileBytes);
  for (int r = 0; r < rows; ++r)
    std::memcpy(d + r * kMaxColsb, static_cast<const uint8_t*>(base) + int64_t(r) * stride, size_t(colsb));
}

void Emulator::stored(int t, void* base, int64_t stride) const {
  need_configured("TILESTORED");
  if (t < 0 || t >= kTiles) throw Error("TILESTORED: no tile " + std::to_string(t));
  for (int r = 0; r < cfg_.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + int64_t(r) * stride, t_[t] + r * kMaxColsb, cfg_.colsb[t]);
}

void Emulator::zero(int t) {
  need_configured("TILEZERO");
  if (t < 0 || t >= kTiles) throw Error("TILEZERO: no tile " + std::to_string(t));
  std::memset(t_[t], 0, kTileBytes);
}

// The #UD conditions of the tile products (SDM, exception class AMX-E4): the three
// operands distinct, tdst.rows == tsrc1.rows, tsrc1.colsb / 4 == tsrc2.rows,
// tdst.colsb == tsrc2.colsb, all within the TMUL's limits (K <= 16 dwords, N <= 16).
void Emulator::check_dp_shapes(const char* insn, int dst, int src1, int src2) const {
  need_configured(insn);
  auto bad = [&](const std::string& why) { throw Error(std::string(insn) + ": #UD: " + why); };
  for (int t : {dst, src1, src2})
    if (t < 0 || t >= kTiles) bad("no tile " + std::to_string(t));
  if (dst == src1 || dst == src2 || src1 == src2)
    bad("operands " + tmm(dst) + ", " + tmm(src1) + ", " + tmm(src2) + " must be distinct tiles");
  const int m = cfg_.rows[dst], n4 = cfg_.colsb[dst];
  if (cfg_.rows[src1] != m)
    bad(tmm(src1) + " has " + std::to_string(cfg_.rows[src1]) + " rows, " + tmm(dst) + " " + std::to_string(m));
  if (cfg_.colsb[src1] / 4 != cfg_.rows[src2])
    bad(tmm(src1) + " has " + std::to_string(cfg_.colsb[src1]) + " bytes per row, so " + tmm(src2) + " needs " +
        std::to_string(cfg_.colsb[src1] / 4) + " rows, not " + std::to_string(cfg_.rows[src2]));
  if (cfg_.colsb[src2] != n4)
    bad(tmm(src2) + " has " + std::to_string(cfg_.colsb[src2]) + " bytes per row, " + tmm(dst) + " " + std::to_string(n4));
  if (cfg_.colsb[src1] > kMaxColsb || cfg_.rows[src2] > kMaxRows || n4 > kMaxColsb) bad("shape exceeds the TMUL limits");
}

void Emulator::dpb(Dp kind, int dst, int src1, int src2) {
  check_dp_shapes(dp_name(kind), dst, src1, src2);
  const bool sa = kind == Dp::SS || kind == Dp::SU, sb = kind == Dp::SS || kind == Dp::US;
  const int M = cfg_.rows[dst], N = cfg_.colsb[dst] / 4, K = cfg_.colsb[src1] / 4;
  const uint8_t *A = t_[src1], *B = t_[src2];
  uint8_t* C = t_[dst];
  for (int m = 0; m < M; ++m) {
    uint32_t tmp[16];
    std::memcpy(tmp, C + m * kMaxColsb, sizeof tmp);
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) {
        // DPBD: four byte products, each sign- or zero-extended, summed; the dword
        // wraps modulo 2^32 (unsigned arithmetic here, so no C++ overflow).
        uint32_t s = 0;
        for (int i = 0; i < 4; ++i) {
          const uint8_t a = A[m * kMaxColsb + 4 * k + i], b = B[k * kMaxColsb + 4 * n + i];
          const int32_t av = sa ? int32_t(int8_t(a)) : int32_t(a), bv = sb ? int32_t(int8_t(b)) : int32_t(b);
          s += uint32_t(av * bv);
        }
        tmp[n] += s;
      }
    // write_row_and_zero: the row's first colsb bytes, the rest zero.
    std::memset(C + m * kMaxColsb, 0, kMaxColsb);
    std::memcpy(C + m * kMaxColsb, tmp, size_t(4 * N));
  }
  for (int m = M; m < kMaxRows; ++m) std::memset(C + m * kMaxColsb, 0, kMaxColsb);  // zero_upper_rows
}

// NaNs as the manual's table for the bf16 dot products orders them (an operand NaN
// is returned quieted: the multiplicands first, in order, then the accumulator; an
// invalid operation gives the default NaN), matched against the hardware's results.
float fma_daz_ftz(float a, float b, float c) {
  if (is_nan(a)) return quiet(a);
  if (is_nan(b)) return quiet(b);
  if (is_nan(c)) return quiet(c);
  const float r = std::fmaf(flush(a), flush(b), flush(c));
  if (is_nan(r)) return u2f(kDefaultNaN);  // inf * 0, inf - inf
  return flush(r);
}
float add_daz_ftz(float a, float b) {
  if (is_nan(a)) return quiet(a);
  if (is_nan(b)) return quiet(b);
  const float r = flush(a) + flush(b);
  if (is_nan(r)) return u2f(kDefaultNaN);
  return flush(r);
}

// TDPBF16PS as the SDM writes it: per row m, two float accumulators per output column
// n start at zero, one for the even and one for the odd bf16 of each pair; every
// pair k adds its products to them by FMA (DAZ, FTZ, round to nearest even); then the
// two are added, and that sum is added to the destination element (same rules). NaNs:
// the destination's own NaN wins over one from the products (checked against the
// instruction: the pair sum's NaN first disagreed in NaN payloads only).
void Emulator::dpbf16ps(int dst, int src1, int src2) {
  check_dp_shapes("TDPBF16PS", dst, src1, src2);
  const int M = cfg_.rows[dst], N = cfg_.colsb[dst] / 4, K = cfg_.colsb[src1] / 4;
  const uint8_t *A = t_[src1], *B = t_[src2];
  uint8_t* C = t_[dst];
  auto bf = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return u2f(bf16_bits_to_f32_bits(h));
  };
  for (int m = 0; m < M; ++m) {
    float even[16] = {}, odd[16] = {}, out[16];
    std::memcpy(out, C + m * kMaxColsb, sizeof out);
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) {
        const uint8_t *a = A + m * kMaxColsb + 4 * k, *b = B + k * kMaxColsb + 4 * n;
        even[n] = fma_daz_ftz(bf(a), bf(b), even[n]);
        odd[n] = fma_daz_ftz(bf(a + 2), bf(b + 2), odd[n]);
      }
    for (int n = 0; n < N; ++n) out[n] = add_daz_ftz(out[n], add_daz_ftz(even[n], odd[n]));
    std::memset(C + m * kMaxColsb, 0, kMaxColsb);
    std::memcpy(C + m * kMaxColsb, out, size_t(4 * N));
  }
  for (int m = M; m < kMaxRows; ++m) std::memset(C + m * kMaxColsb, 0, kMaxColsb);
}

Emulator& thread_emulator() {
  thread_local Emulator e;
  return e;
}

}  // namespace tessera::cpu_amx::tile
