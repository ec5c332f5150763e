// The real tile instructions with runtime tile numbers (compiled with -mamx-tile
// -mamx-int8 -mamx-bf16). Reached only after the probe found AMX usable (CPUID, XCR0
// and the arch_prctl permission): the tests and the backend check first.
//
// GCC's tile intrinsics paste their tile numbers into the instruction text, so each
// tile (and each triple of distinct tiles of a product) is spelled out below.
#include <immintrin.h>

#include <string>

#include "tile.h"
#include "tessera/error.h"

namespace tessera::cpu_amx::tile::real {

namespace {

// Every (dst, src1, src2) of distinct tiles (the products' #UD rule).
#define TESSERA_AMX_TRIPLES(X) \
  X(0,1,2) X(0,1,3) X(0,1,4) X(0,1,5) X(0,1,6) X(0,1,7) X(0,2,1) X(0,2,3) X(0,2,4) X(0,2,5) X(0,2,6) X(0,2,7) \
  X(0,3,1) X(0,3,2) X(0,3,4) X(0,3,5) X(0,3,6) X(0,3,7) X(0,4,1) X(0,4,2) X(0,4,3) X(0,4,5) X(0,4,6) X(0,4,7) \
  X(0,5,1) X(0,5,2) X(0,5,3) X(0,5,4) X(0,5,6) X(0,5,7) X(0,6,1) X(0,6,2) X(0,6,3) X(0,6,4) X(0,6,5) X(0,6,7) \
  X(0,7,1) X(0,7,2) X(0,7,3) X(0,7,4) X(0,7,5) X(0,7,6) X(1,0,2) X(1,0,3) X(1,0,4) X(1,0,5) X(1,0,6) X(1,0,7) \
  X(1,2,0) X(1,2,3) X(1,2,4) X(1,2,5) X(1,2,6) X(1,2,7) X(1,3,0) X(1,3,2) X(1,3,4) X(1,3,5) X(1,3,6) X(1,3,7) \
  X(1,4,0) X(1,4,2) X(1,4,3) X(1,4,5) X(1,4,6) X(1,4,7) X(1,5,0) X(1,5,2) X(1,5,3) X(1,5,4) X(1,5,6) X(1,5,7) \
  X(1,6,0) X(1,6,2) X(1,6,3) X(1,6,4) X(1,6,5) X(1,6,7) X(1,7,0) X(1,7,2) X(1,7,3) X(1,7,4) X(1,7,5) X(1,7,6) \
  X(2,0,1) X(2,0,3) X(2,0,4) X(2,0,5) X(2,0,6) X(2,0,7) X(2,1,0) X(2,1,3) X(2,1,4) X(2,1,5) X(2,1,6) X(2,1,7) \
  X(2,3,0) X(2,3,1) X(2,3,4) X(2,3,5) X(2,3,6) X(2,3,7) X(2,4,0) X(2,4,1) X(2,4,3) X(2,4,5) X(2,4,6) X(2,4,7) \
  X(2,5,0) X(2,5,1) X(2,5,3) X(2,5,4) X(2,5,6) X(2,5,7) X(2,6,0) X(2,6,1) X(2,6,3) X(2,6,4) X(2,6,5) X(2,6,7) \
  X(2,7,0) X(2,7,1) X(2,7,3) X(2,7,4) X(2,7,5) X(2,7,6) X(3,0,1) X(3,0,2) X(3,0,4) X(3,0,5) X(3,0,6) X(3,0,7) \
  X(3,1,0) X(3,1,2) X(3,1,4) X(3,1,5) X(3,1,6) X(3,1,7) X(3,2,0) X(3,2,1) X(3,2,4) X(3,2,5) X(3,2,6) X(3,2,7) \
  X(3,4,0) X(3,4,1) X(3,4,2) X(3,4,5) X(3,4,6) X(3,4,7) X(3,5,0) X(3,5,1) X(3,5,2) X(3,5,4) X(3,5,6) X(3,5,7) \
  X(3,6,0) X(3,6,1) X(3,6,2) X(3,6,4) X(3,6,5) X(3,6,7) X(3,7,0) X(3,7,1) X(3,7,2) X(3,7,4) X(3,7,5) X(3,7,6) \
  X(4,0,1) X(4,0,2) X(4,0,3) X(4,0,5) X(4,0,6) X(4,0,7) X(4,1,0) X(4,1,2) X(4,1,3) X(4,1,5) X(4,1,6) X(4,1,7) \
  X(4,2,0) X(4,2,1) X(4,2,3) X(4,2,5) X(4,2,6) X(4,2,7) X(4,3,0) X(4,3,1) X(4,3,2) X(4,3,5) X(4,3,6) X(4,3,7) \
  X(4,5,0) X(4,5,1) X(4,5,2) X(4,5,3) X(4,5,6) X(4,5,7) X(4,6,0) X(4,6,1) X(4,6,2) X(4,6,3) X(4,6,5) X(4,6,7) \
  X(4,7,0) X(4,7,1) X(4,7,2) X(4,7,3) X(4,7,5) X(4,7,6) X(5,0,1) X(5,0,2) X(5,0,3) X(5,0,4) X(5,0,6) X(5,0,7) \
  X(5,1,0) X(5,1,2) X(5,1,3) X(5,1,4) X(5,1,6) X(5,1,7) X(5,2,0) X(5,2,1) X(5,2,3) X(5,2,4) X(5,2,6) X(5,2,7) \
  X(5,3,0) X(5,3,1) X(5,3,2) X(5,3,4) X(5,3,6) X(5,3,7) X(5,4,0) X(5,4,1) X(5,4,2) X(5,4,3) X(5,4,6) X(5,4,7) \
  X(5,6,0) X(5,6,1) X(5,6,2) X(5,6,3) X(5,6,4) X(5,6,7) X(5,7,0) X(5,7,1) X(5,7,2) X(5,7,3) X(5,7,4) X(5,7,6) \
  X(6,0,1) X(6,0,2) X(6,0,3) X(6,0,4) X(6,0,5) X(6,0,7) X(6,1,0) X(6,1,2) X(6,1,3) X(6,1,4) X(6,1,5) X(6,1,7) \
  X(6,2,0) X(6,2,1) X(6,2,3) X(6,2,4) X(6,2,5) X(6,2,7) X(6,3,0) X(6,3,1) X(6,3,2) X(6,3,4) X(6,3,5) X(6,3,7) \
  X(6,4,0) X(6,4,1) X(6,4,2) X(6,4,3) X(6,4,5) X(6,4,7) X(6,5,0) X(6,5,1) X(6,5,2) X(6,5,3) X(6,5,4) X(6,5,7) \
  X(6,7,0) X(6,7,1) X(6,7,2) X(6,7,3) X(6,7,4) X(6,7,5) X(7,0,1) X(7,0,2) X(7,0,3) X(7,0,4) X(7,0,5) X(7,0,6) \
  X(7,1,0) X(7,1,2) X(7,1,3) X(7,1,4) X(7,1,5) X(7,1,6) X(7,2,0) X(7,2,1) X(7,2,3) X(7,2,4) X(7,2,5) X(7,2,6) \
  X(7,3,0) X(7,3,1) X(7,3,2) X(7,3,4) X(7,3,5) X(7,3,6) X(7,4,0) X(7,4,1) X(7,4,2) X(7,4,3) X(7,4,5) X(7,4,6) \
  X(7,5,0) X(7,5,1) X(7,5,2) X(7,5,3) X(7,5,4) X(7,5,6) X(7,6,0) X(7,6,1) X(7,6,2) X(7,6,3) X(7,6,4) X(7,6,5)

void check(int t) {
  if (t < 0 || t >= kTiles) throw Error("no tile " + std::to_string(t));
}
int triple(int d, int a, int b) {
  check(d), check(a), check(b);
  if (d == a || d == b || a == b) throw Error("tile products need three distinct tiles");
  return d * 64 + a * 8 + b;
}

}  // namespace

void ldtilecfg(const Config& cfg) { _tile_loadconfig(&cfg); }
void release() { _tile_release(); }

#define TESSERA_AMX_EACH_TILE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

void loadd(int t, const void* base, int64_t stride) {
  check(t);
  switch (t) {
#define X(n) \
  case n: _tile_loadd(n, base, stride); break;
    TESSERA_AMX_EACH_TILE(X)
#undef X
  }
}

void stored(int t, void* base, int64_t stride) {
  check(t);
  switch (t) {
#define X(n) \
  case n: _tile_stored(n, base, stride); break;
    TESSERA_AMX_EACH_TILE(X)
#undef X
  }
}

void zero(int t) {
  check(t);
  switch (t) {
#define X(n) \
  case n: _tile_zero(n); break;
    TESSERA_AMX_EACH_TILE(X)
#undef X
  }
}

void dpb(Dp kind, int dst, int src1, int src2) {
  const int code = triple(dst, src1, src2);
  switch (kind) {
    case Dp::SS:
      switch (code) {
#define X(d, a, b) \
  case d * 64 + a * 8 + b: _tile_dpbssd(d, a, b); break;
        TESSERA_AMX_TRIPLES(X)
#undef X
      }
      break;
    case Dp::SU:
      switch (code) {
#define X(d, a, b) \
  case d * 64 + a * 8 + b: _tile_dpbsud(d, a, b); break;
        TESSERA_AMX_TRIPLES(X)
#undef X
      }
      break;
    case Dp::US:
      switch (code) {
#define X(d, a, b) \
  case d * 64 + a * 8 + b: _tile_dpbusd(d, a, b); break;
        TESSERA_AMX_TRIPLES(X)
#undef X
      }
      break;
    case Dp::UU:
      switch (code) {
#define X(d, a, b) \
  case d * 64 + a * 8 + b: _tile_dpbuud(d, a, b); break;
        TESSERA_AMX_TRIPLES(X)
#undef X
      }
      break;
  }
}

void dpbf16ps(int dst, int src1, int src2) {
  switch (triple(dst, src1, src2)) {
#define X(d, a, b) \
  case d * 64 + a * 8 + b: _tile_dpbf16ps(d, a, b); break;
    TESSERA_AMX_TRIPLES(X)
#undef X
  }
}

}  // namespace tessera::cpu_amx::tile::real
