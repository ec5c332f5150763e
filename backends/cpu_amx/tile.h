// The AMX tile layer of the cpu_amx backend: the tile configuration, and two
// implementations of the tile instructions it uses (TILELOADD, TILESTORED, TILEZERO,
// TDPBSSD / TDPBSUD / TDPBUSD / TDPBUUD, TDPBF16PS, LDTILECFG, TILERELEASE):
//
//  - tile::Emulator: plain C++ following the Intel SDM's pseudocode (palette 1: 8
//    tiles of at most 16 rows x 64 bytes; int32 wrap-around; TDPBF16PS with input
//    denormals as zero, output denormals flushed, round to nearest even). What the
//    hardware raises (#GP for a bad LDTILECFG operand, #UD for a tile instruction
//    whose shapes do not fit or that runs unconfigured) is thrown as tessera::Error.
//    Compiled without ISA flags: runs on any x86-64 CPU.
//  - tile::real: the instructions themselves (tile_real.cpp, compiled with
//    -mamx-tile -mamx-int8 -mamx-bf16), with runtime tile numbers for the tests. Never
//    call it unless amx_hardware_usable() said yes.
//
// Each thread has its own tile state (the OS switches it with the thread), so every
// thread that computes with tiles loads a configuration first; the permission to use
// tile data (arch_prctl) is per process and requested by tessera::cpu_features().
#pragma once
#include <cstdint>
#include <string>

namespace tessera::cpu_amx::tile {

constexpr int kTiles = 8;       // palette 1: tmm0 .. tmm7
constexpr int kMaxRows = 16;    // rows per tile
constexpr int kMaxColsb = 64;   // bytes per row
constexpr int kTileBytes = kMaxRows * kMaxColsb;

// LDTILECFG's 64-byte memory operand.
struct alignas(64) Config {
  uint8_t palette_id = 0;
  uint8_t start_row = 0;
  uint8_t reserved0[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tmm0..tmm7; 8..15 reserved (zero)
  uint8_t rows[16] = {};    // rows of tmm0..tmm7; 8..15 reserved (zero)
};
static_assert(sizeof(Config) == 64);

// Empty when LDTILECFG accepts cfg (palette 0 or 1), else why it raises #GP.
std::string check_config(const Config& cfg);

// Signedness of the int8 operands of TDPB[S|U][S|U]D: first letter A (tsrc1), second B (tsrc2).
enum class Dp { SS, SU, US, UU };
const char* dp_name(Dp k);  // "TDPBSSD" ...

// IEEE binary32 bits of the bf16 x (its 16 bits on top).
inline uint32_t bf16_bits_to_f32_bits(uint16_t x) { return uint32_t(x) << 16; }

class Emulator {
 public:
  Emulator();
  // LDTILECFG: palette 0 returns to the init state (unconfigured, tiles zero); an
  // invalid operand throws (#GP) and leaves the state as it was.
  void ldtilecfg(const Config& cfg);
  void release();  // TILERELEASE
  bool configured() const { return configured_; }
  const Config& config() const { return cfg_; }
  // TILELOADD: row r of tile t from base + r * stride (colsb bytes; the rest of the
  // row and the rows past `rows` read as zero).
  void loadd(int t, const void* base, int64_t stride);
  // TILESTORED: rows x colsb bytes of tile t to base + r * stride.
  void stored(int t, void* base, int64_t stride) const;
  void zero(int t);  // TILEZERO
  // tdst (rows M, colsb 4N int32) += tsrc1 (M x 4K int8) * tsrc2 (K rows x 4N int8
  // in VNNI pairs of four): dword n of row m adds the four byte products of dword k of
  // tsrc1's row m and dword n of tsrc2's row k, for every k, wrapping modulo 2^32.
  void dpb(Dp kind, int dst, int src1, int src2);
  // tdst (M x N float) += tsrc1 (M x K bf16 pairs) * tsrc2 (K rows x N bf16 pairs),
  // the SDM's arithmetic: see tile_emu.cpp.
  void dpbf16ps(int dst, int src1, int src2);
  // Raw bytes of tile t (kMaxRows x kMaxColsb), for tests.
  const uint8_t* data(int t) const { return t_[t]; }

 private:
  void need_configured(const char* insn) const;
  void check_dp_shapes(const char* insn, int dst, int src1, int src2) const;
  Config cfg_;
  bool configured_ = false;
  alignas(64) uint8_t t_[kTiles][kTileBytes];
};

// This thread's emulated tile state.
Emulator& thread_emulator();

// The bf16 arithmetic of TDPBF16PS's inner steps, exposed for tests: a binary32 FMA
// a * b + c with inputs' denormals read as zero, the result rounded to nearest even
// and a denormal result flushed to zero (sign kept).
float fma_daz_ftz(float a, float b, float c);
float add_daz_ftz(float a, float b);

// ---- The real instructions (tile_real.cpp) --------------------------------------
// Runtime tile numbers are mapped onto the instructions' immediates; the products
// accept any three distinct tiles. Invalid operands fault in hardware exactly as the
// manual says (SIGSEGV for #GP, SIGILL for #UD): check with the emulator first.
namespace real {
void ldtilecfg(const Config& cfg);
void release();
void loadd(int t, const void* base, int64_t stride);
void stored(int t, void* base, int64_t stride);
void zero(int t);
void dpb(Dp kind, int dst, int src1, int src2);
void dpbf16ps(int dst, int src1, int src2);
}  // namespace real

}  // namespace tessera::cpu_amx::tile
