// The conformance suite: case generator and runner (see tessera/conformance.h and
// docs/conformance.md).
#include "tessera/conformance.h"
#include "tessera/rope_table.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <tuple>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/kv_cache.h"
#include "tessera/quant.h"
#include "tessera/tensor.h"

namespace tessera {
namespace {

// ---------------------------------------------------------------------------
// Names and limits

const char* op_label(Op op) {
  switch (op) {
    case Op::GetRows: return "GetRows";
    case Op::RmsNorm: return "RmsNorm";
    case Op::MatMul: return "MatMul";
    case Op::Rope: return "Rope";
    case Op::KvWrite: return "KvWrite";
    case Op::Attention: return "Attention";
    case Op::Softmax: return "Softmax";
    case Op::Silu: return "Silu";
    case Op::SwiGlu: return "SwiGlu";
    case Op::GeGlu: return "GeGlu";
    case Op::NormalizeRows: return "NormalizeRows";
    case Op::SwiGluOai: return "SwiGluOai";
    case Op::Concat: return "Concat";
    case Op::GroupLimit: return "GroupLimit";
    case Op::Add: return "Add";
    case Op::Mul: return "Mul";
    case Op::Argmax: return "Argmax";
    case Op::TopK: return "TopK";
    case Op::GatherCols: return "GatherCols";
    case Op::MatMulId: return "MatMulId";
    case Op::MoeCombine: return "MoeCombine";
    case Op::Sigmoid: return "Sigmoid";
    case Op::Softplus: return "Softplus";
    case Op::Cont: return "Cont";
    case Op::SsmConv: return "SsmConv";
    case Op::GatedDeltaNet: return "GatedDeltaNet";
    case Op::Count: break;
  }
  return "?";
}

// Lower case without underscores: "MatMul", "mat_mul" and "matmul" all compare equal.
std::string fold(std::string_view s) {
  std::string out;
  for (char ch : s)
    if (ch != '_') out += char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) {
    h ^= uint8_t(ch);
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---------------------------------------------------------------------------
// Batched attention layouts (Attention cases with flag; c.n picks one). P = page
// tokens. Sequences are created in list order (a fork after its parent); step 1 is
// one batch of slices, consecutive rows of the batch tensors in `step1` order, each
// sequence once; step 2 decodes one token of every sequence, rows in `step2` order.

struct BatchSeq {
  int parent;        // index of the sequence this one forks, or -1
  int64_t fork_at;   // positions shared with the parent (0 for a root)
  int64_t history;   // cached positions before step 1 (>= fork_at)
};
struct BatchSlice {
  int seq;
  int64_t count;  // rows (tokens) in the batch; 1 = a decode slice
};
struct BatchLayout {
  std::vector<BatchSeq> seqs;
  std::vector<BatchSlice> step1;
  std::vector<int> step2;  // decode rows, by sequence
  int64_t step1_rows() const {
    int64_t n = 0;
    for (const BatchSlice& s : step1) n += s.count;
    return n;
  }
};

BatchLayout batch_layout(int64_t n_seqs, int64_t P) {
  BatchLayout l;
  if (n_seqs == 4) {
    // 0: a root with 2P+3 cached positions; 1: a new prompt (nothing cached);
    // 2: a fork of 0 at the page boundary 2P (shares two full pages, appends into a
    // page of its own); 3: a fork of 0 at P+2, inside a page 0 has filled further,
    // so that page is copied when 3 reserves its next positions.
    l.seqs = {{-1, 0, 2 * P + 3}, {-1, 0, 0}, {0, 2 * P, 2 * P}, {0, P + 2, P + 2}};
    l.step1 = {{0, 1}, {1, P + 3}, {3, 1}, {2, 5}};  // decode, prefill, decode, prefill
    l.step2 = {2, 3, 1, 0};
  } else if (n_seqs == 3) {
    // 0: a root with P+1 cached; 1: a fork of 0 at its end (P+1, inside a page): both
    // then write into the page they share, 1 reserves first and copies it, 0 keeps it;
    // 2: a root with a long history.
    l.seqs = {{-1, 0, P + 1}, {0, P + 1, P + 1}, {-1, 0, 3 * P + 2}};
    l.step1 = {{1, 4}, {2, 1}, {0, 3}};  // prefill, decode, prefill
    l.step2 = {2, 0, 1};
  } else {
    throw Error("conformance: no batched attention layout with " + std::to_string(n_seqs) + " sequences");
  }
  return l;
}

// ---------------------------------------------------------------------------
// The cases

// GCC 12 reports `"K" + std::to_string(K)` (operator+ of a literal and a temporary string,
// inlined from libstdc++) as an overlapping memcpy: a known false positive of its
// -Wrestrict (GCC bug 105651, fixed in GCC 13), which this function's case names hit.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
std::vector<ConformanceCase> make_cases() {
  std::vector<ConformanceCase> cs;
  auto add = [&](ConformanceCase c, Op op, DType t, std::string shape) {
    c.kind = op;
    c.type = t;
    c.op = op_label(op);
    c.dtype = std::string(dtype_name(t));
    for (char& ch : c.dtype) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    c.shape = std::move(shape);
    c.seed = fnv1a(c.name());
    cs.push_back(std::move(c));
  };
  auto s = [](auto v) { return std::to_string(v); };
  // Every weight format a model file may hold (every type GGUF publishes).
  const DType matrix_types[] = {DType::F32,  DType::F16,    DType::BF16,  DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                DType::Q5_0, DType::Q5_1,   DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                                DType::Q4_K, DType::Q5_K,   DType::Q6_K,  DType::IQ4_XS};
  auto row_ok = [](DType t, int64_t K) {
    return K % dtype_traits(t).block_elems == 0 && K % dtype_traits(quant::vec_dot_type(t)).block_elems == 0;
  };

  // MatMul: every weight dtype x K (as the block size allows; 33 for the plain types)
  // x N (weight rows) x M (tokens: one and several).
  for (DType t : matrix_types)
    for (int64_t K : {33, 32, 96, 256, 512}) {
      if (!row_ok(t, K)) continue;
      for (int64_t N : {1, 7, 33, 130})
        for (int64_t M : {1, 3, 17}) {
          ConformanceCase c;
          c.k = K, c.n = N, c.m = M;
          add(c, Op::MatMul, t, std::string("K") + s(K) + "_N" + s(N) + "_M" + s(M));
        }
    }

  // GetRows: every table dtype, the smallest and a larger row length, a single id and
  // several (with repeats, the first and the last row).
  for (DType t : matrix_types) {
    std::vector<int64_t> ks;
    for (int64_t K : {33, 32, 96, 256, 512})
      if (row_ok(t, K) && (ks.empty() || K == 512)) ks.push_back(K);
    if (std::find(ks.begin(), ks.end(), 512) == ks.end()) ks.push_back(512);
    for (int64_t K : ks)
      for (auto [V, n] : {std::pair<int64_t, int64_t>{7, 1}, {130, 9}}) {
        ConformanceCase c;
        c.k = K, c.n = V, c.m = n;
        add(c, Op::GetRows, t, std::string("K") + s(K) + "_V" + s(V) + "_n" + s(n));
      }
  }

  // RmsNorm with and without weight.
  for (int64_t K : {33, 256, 4096})
    for (int64_t rows : {1, 7})
      for (bool w : {true, false}) {
        ConformanceCase c;
        c.k = K, c.n = rows, c.flag = w;
        add(c, Op::RmsNorm, DType::F32, std::string("K") + s(K) + "_n" + s(rows) + (w ? "_weight" : "_noweight"));
      }

  // Rope: normal and NeoX, full and partial n_dims, one token at 0 and several at an offset.
  for (int64_t hd : {64, 128})
    for (int32_t mode : {int32_t(kRopeNormal), int32_t(kRopeNeox)})
      for (int32_t nd : {int32_t(hd), int32_t(hd / 4)})
        for (int variant = 0; variant < 2; ++variant) {
          ConformanceCase c;
          c.k = hd, c.n = variant ? 3 : 4, c.m = variant ? 7 : 1;
          c.n_dims = nd, c.mode = mode, c.pos0 = variant ? 1000 : 0;
          c.freq_scale = variant ? 0.5f : 1.0f;
          add(c, Op::Rope, DType::F32,
              std::string(mode == kRopeNeox ? "neox" : "normal") + "_hd" + s(hd) + "_nd" + s(nd) + "_h" + s(c.n) +
                  "_T" + s(c.m) + "_p" + s(c.pos0) + (variant ? "_fs05" : "_fs1"));
        }
  // Rope with frequency factors (src2, Llama 3.1; the Hugging Face loader runs Llama as
  // NeoX with them): both modes, full and partial n_dims.
  for (int32_t mode : {int32_t(kRopeNormal), int32_t(kRopeNeox)})
    for (int32_t nd : {128, 32})
      for (int variant = 0; variant < 2; ++variant) {
        ConformanceCase c;
        c.k = 128, c.n = variant ? 3 : 4, c.m = variant ? 7 : 1;
        c.n_dims = nd, c.mode = mode, c.pos0 = variant ? 1000 : 0;
        c.freq_scale = 1.0f;
        c.flag = true;  // frequency factors
        add(c, Op::Rope, DType::F32,
            std::string(mode == kRopeNeox ? "neox" : "normal") + "_hd128_nd" + s(nd) + "_h" + s(c.n) + "_T" + s(c.m) +
                "_p" + s(c.pos0) + "_factors");
      }

  // YaRN (gpt-oss, DeepSeek-V3): NeoX and normal, full and partial, over a short and a
  // long original context, at 0 and far beyond it.
  for (auto [mode, hd, nd, ctx, fs, p0] : {std::tuple<int32_t, int64_t, int32_t, int32_t, float, int32_t>{kRopeNeox, 64, 64, 256, 1.f / 32, 0},
                                          {kRopeNeox, 64, 64, 4096, 1.f / 32, 5000},
                                          {kRopeNormal, 64, 16, 128, 1.f / 40, 300},
                                          {kRopeNeox, 128, 32, 4096, 0.25f, 70000}}) {
    ConformanceCase c;
    c.k = hd, c.n = 3, c.m = 5, c.n_dims = nd, c.mode = mode, c.pos0 = p0, c.freq_scale = fs, c.yarn_ctx = ctx;
    add(c, Op::Rope, DType::F32,
        std::string(mode == kRopeNeox ? "neox" : "normal") + "_hd" + s(hd) + "_nd" + s(nd) + "_p" + s(p0) + "_yarn" +
            s(ctx) + "_fs" + s(int(1.f / fs)));
  }

  // Softmax rows.
  for (int64_t K : {1, 33, 256, 1000})
    for (int64_t rows : {1, 5}) {
      ConformanceCase c;
      c.k = K, c.n = rows;
      add(c, Op::Softmax, DType::F32, s(K) + "x" + s(rows));
    }

  // Elementwise ops: odd, one-row, long and 3-D shapes.
  const std::array<std::array<int64_t, 3>, 4> ew = {{{33, 3, 1}, {256, 7, 1}, {4096, 1, 1}, {64, 4, 3}}};
  for (Op op : {Op::Silu, Op::SwiGlu, Op::GeGlu, Op::SwiGluOai, Op::Add, Op::Mul})
    for (const auto& e : ew)
      for (bool bcast : {false, true}) {
        if (bcast && op != Op::Mul) continue;
        ConformanceCase c;
        c.k = e[0], c.n = e[1], c.m = e[2], c.flag = bcast;
        add(c, op, DType::F32, s(e[0]) + "x" + s(e[1]) + "x" + s(e[2]) + (bcast ? "_rowbcast" : ""));
      }

  // Argmax: must be identical, including the first of tied maxima.
  for (auto [V, rows, ties] : {std::tuple<int64_t, int64_t, bool>{1, 1, false},
                               {33, 4, false},
                               {1000, 3, false},
                               {32000, 1, false},
                               {1000, 3, true}}) {
    ConformanceCase c;
    c.k = V, c.n = rows, c.flag = ties;
    add(c, Op::Argmax, DType::F32, std::string("V") + s(V) + "_n" + s(rows) + (ties ? "_ties" : ""));
  }

  // KvWrite: compared through the cache contents.
  for (int64_t hd : {64, 128})
    for (int32_t nkv : {2, 8})
      for (auto [T, p0, page] : {std::tuple<int64_t, int32_t, int32_t>{1, 0, 4}, {9, 13, 4}, {19, 0, 16}}) {
        ConformanceCase c;
        c.k = hd, c.n_kv = nkv, c.m = T, c.pos0 = p0, c.page = page;
        add(c, Op::KvWrite, DType::F32,
            "hd" + s(hd) + "_kv" + s(nkv) + "_T" + s(T) + "_p" + s(p0) + "_pg" + s(page));
      }

  // Attention (+KvWrite): GQA and plain, two head sizes, small and large pages, a
  // prefill of several tokens (spanning pages) then a decode step, from position 0
  // and after cached history.
  for (auto [nh, nkv] : {std::pair<int32_t, int32_t>{4, 2}, {8, 8}})
    for (int64_t hd : {64, 128})
      for (int32_t page : {4, 16})
        for (int32_t p0 : {0, 21}) {
          ConformanceCase c;
          c.k = hd, c.n_head = nh, c.n_kv = nkv, c.page = page, c.pos0 = p0;
          c.m = page == 4 ? 9 : 19;
          add(c, Op::Attention, DType::F32,
              "hd" + s(hd) + "_h" + s(nh) + "_kv" + s(nkv) + "_pg" + s(page) + "_p" + s(p0) + "_T" + s(c.m) + "_dec1");
        }

  // Sliding windows: shorter than the prefill, than the history, and than one page; the
  // table's pages wholly before the window are -1 (released).
  for (auto [hd, nh, nkv, page, p0, T, win] :
       {std::tuple<int64_t, int32_t, int32_t, int32_t, int32_t, int64_t, int32_t>{64, 4, 2, 4, 21, 9, 8},
        {128, 8, 8, 16, 21, 19, 5},
        {64, 4, 2, 4, 0, 9, 3},
        {64, 4, 1, 4, 13, 1, 8}}) {
    ConformanceCase c;
    c.k = hd, c.n_head = nh, c.n_kv = nkv, c.page = page, c.pos0 = p0, c.m = T, c.window = win;
    add(c, Op::Attention, DType::F32,
        "hd" + s(hd) + "_h" + s(nh) + "_kv" + s(nkv) + "_pg" + s(page) + "_p" + s(p0) + "_T" + s(T) + "_win" + s(win) +
            "_dec1");
  }

  // Attention sinks (gpt-oss), with and without a window.
  for (auto [hd, nh, nkv, page, p0, T, win] :
       {std::tuple<int64_t, int32_t, int32_t, int32_t, int32_t, int64_t, int32_t>{64, 4, 2, 4, 21, 9, 0},
        {64, 8, 2, 16, 0, 19, 8},
        {128, 4, 4, 4, 13, 1, 0}}) {
    ConformanceCase c;
    c.k = hd, c.n_head = nh, c.n_kv = nkv, c.page = page, c.pos0 = p0, c.m = T, c.window = win, c.sinks = true;
    add(c, Op::Attention, DType::F32,
        "hd" + s(hd) + "_h" + s(nh) + "_kv" + s(nkv) + "_pg" + s(page) + "_p" + s(p0) + "_T" + s(T) +
            (win ? "_win" + s(win) : std::string()) + "_sinks_dec1");
  }

  // Multi-head latent attention (deepseek2): one KV head whose rows are a latent then a
  // roped part, V the latent read out of the same rows; the fixture's shape, DeepSeek-V3's
  // (512 + 64) and a prefill spanning pages after cached history.
  for (auto [lat, rope, nh, page, p0, T] : {std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int64_t>{64, 16, 4, 4, 21, 9},
                                           {64, 16, 16, 16, 0, 19},
                                           {512, 64, 8, 16, 13, 5}}) {
    ConformanceCase c;
    c.k = lat + rope, c.latent = lat, c.n_head = nh, c.n_kv = 1, c.page = page, c.pos0 = p0, c.m = T;
    add(c, Op::Attention, DType::F32,
        "hd" + s(lat + rope) + "_latent" + s(lat) + "_h" + s(nh) + "_pg" + s(page) + "_p" + s(p0) + "_T" + s(T) + "_dec1");
  }

  // Batched attention: several sequences of different lengths in one cache, some
  // forked from others (sharing pages, copy on write), one step mixing prefill and
  // decode slices over row views of shared batch tensors (every Attention writing its
  // rows of one shared dst), then a decode step of every sequence.
  for (int64_t n_seqs : {4, 3})
    for (auto [nh, nkv] : {std::pair<int32_t, int32_t>{4, 2}, {8, 8}})
      for (int64_t hd : {64, 128})
        for (int32_t page : {4, 16}) {
          const BatchLayout l = batch_layout(n_seqs, page);
          ConformanceCase c;
          c.flag = true;
          c.n = n_seqs;
          c.k = hd, c.n_head = nh, c.n_kv = nkv, c.page = page, c.pos0 = 0;
          c.m = l.step1_rows();
          std::string rows;  // step 1's slices in batch order, e.g. "T1_7_1_5"
          for (const BatchSlice& sl : l.step1) rows += (rows.empty() ? "_T" : "_") + s(sl.count);
          add(c, Op::Attention, DType::F32,
              "batch" + s(n_seqs) + "_hd" + s(hd) + "_h" + s(nh) + "_kv" + s(nkv) + "_pg" + s(page) + rows + "_dec1");
        }

  // Mixture of experts. TopK: ids must be identical (ties go to the lower id).
  for (auto [E, k, n, ties] : {std::tuple<int64_t, int64_t, int64_t, bool>{8, 2, 1, false},
                               {8, 2, 17, false},
                               {128, 8, 5, false},
                               {8, 3, 6, true}}) {
    ConformanceCase c;
    c.k = E, c.m = k, c.n = n, c.flag = ties;
    add(c, Op::TopK, DType::F32, "E" + s(E) + "_k" + s(k) + "_n" + s(n) + (ties ? "_ties" : ""));
  }
  for (auto [E, k, n] : {std::tuple<int64_t, int64_t, int64_t>{8, 2, 1}, {128, 8, 9}}) {
    ConformanceCase c;
    c.k = E, c.m = k, c.n = n;
    add(c, Op::GatherCols, DType::F32, "E" + s(E) + "_k" + s(k) + "_n" + s(n));
  }
  // MatMulId: every expert dtype, one token and several, x shared (b = 1) or per slot.
  for (DType t : matrix_types)
    for (int64_t K : {32, 256}) {
      if (!row_ok(t, K)) continue;
      for (auto [N, n, per_slot] : {std::tuple<int64_t, int64_t, bool>{7, 1, false}, {33, 5, false}, {33, 5, true}}) {
        ConformanceCase c;
        c.k = K, c.n = N, c.m = n, c.flag = per_slot, c.n_head = 4 /* experts */, c.n_kv = 2 /* used */;
        add(c, Op::MatMulId, t, "K" + s(K) + "_N" + s(N) + "_n" + s(n) + "_E4_k2" + (per_slot ? "_xk" : "_x1"));
      }
    }
  // MatMulId at expert-tensor shapes a backend may repack per expert (full and partial
  // 16-row tiles): a many-token prefill over an odd expert count (several tokens per
  // expert, x shared or per slot) and a decode step choosing 8 of 128 experts.
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::IQ4_XS})
    for (auto [N, n, E, k, per_slot] : {std::tuple<int64_t, int64_t, int32_t, int32_t, bool>{48, 64, 7, 3, false},
                                        {40, 64, 7, 3, true},
                                        {33, 1, 128, 8, false}}) {
      ConformanceCase c;
      c.k = 256, c.n = N, c.m = n, c.flag = per_slot, c.n_head = E, c.n_kv = k;
      add(c, Op::MatMulId, t,
          "K256_N" + s(N) + "_n" + s(n) + "_E" + s(E) + "_k" + s(k) + (per_slot ? "_xk" : "_x1"));
    }
  for (auto [N, k, n] : {std::tuple<int64_t, int64_t, int64_t>{33, 2, 1}, {256, 8, 7}}) {
    ConformanceCase c;
    c.k = N, c.m = k, c.n = n;
    add(c, Op::MoeCombine, DType::F32, "N" + s(N) + "_k" + s(k) + "_n" + s(n));
  }

  // Concat (latent attention's query and cached row) and GroupLimit (routing by expert
  // groups: 8 groups keeping 4, and single-expert groups; a tie between two groups).
  for (auto [a, b, rows] : {std::tuple<int64_t, int64_t, int64_t>{64, 16, 12}, {512, 64, 3}, {1, 7, 5}}) {
    ConformanceCase c;
    c.k = a, c.n = b, c.m = rows;
    add(c, Op::Concat, DType::F32, "A" + s(a) + "_B" + s(b) + "_rows" + s(rows));
  }
  for (auto [E, groups, kept, n, ties] : {std::tuple<int64_t, int32_t, int32_t, int64_t, bool>{256, 8, 4, 5, false},
                                          {16, 4, 2, 7, false},
                                          {8, 8, 3, 3, false},
                                          {16, 4, 2, 4, true}}) {
    ConformanceCase c;
    c.k = E, c.n = n, c.n_head = groups, c.n_kv = kept, c.flag = ties;
    add(c, Op::GroupLimit, DType::F32,
        "E" + s(E) + "_g" + s(groups) + "_keep" + s(kept) + "_n" + s(n) + (ties ? "_ties" : ""));
  }

  // Gates, views and the gated delta-net (qwen35moe).
  for (auto [K, N, tiny] : {std::tuple<int64_t, int64_t, bool>{2, 5, false}, {8, 3, false}, {4, 2, true}}) {
    ConformanceCase c;
    c.k = K, c.n = N, c.flag = tiny;
    add(c, Op::NormalizeRows, DType::F32, "K" + s(K) + "_N" + s(N) + (tiny ? "_floor" : ""));
  }
  for (Op op : {Op::Sigmoid, Op::Softplus})
    for (auto [K, N, M] : {std::tuple<int64_t, int64_t, int64_t>{1, 4, 1}, {33, 3, 5}, {256, 2, 1}}) {
      ConformanceCase c;
      c.k = K, c.n = N, c.m = M;
      add(c, op, DType::F32, "K" + s(K) + "_N" + s(N) + "_M" + s(M));
    }
  for (auto [K, N, M, odd] : {std::tuple<int64_t, int64_t, int64_t, bool>{64, 4, 3, false}, {64, 4, 3, true}, {33, 1, 5, true}}) {
    ConformanceCase c;
    c.k = K, c.n = N, c.m = M, c.flag = odd;
    add(c, Op::Cont, DType::F32, "K" + s(K) + "_N" + s(N) + "_M" + s(M) + (odd ? "_off" : "_even"));
  }
  for (auto [hd, nd, sec, p0] : {std::tuple<int64_t, int32_t, std::array<int32_t, 4>, int32_t>{64, 16, {3, 3, 2, 0}, 0},
                                 {64, 16, {3, 3, 2, 0}, 37}, {128, 64, {11, 11, 10, 0}, 5}, {64, 16, {2, 2, 2, 2}, 9}}) {
    ConformanceCase c;
    c.k = hd, c.n = 3, c.m = 4, c.n_dims = nd, c.mode = kRopeImrope, c.pos0 = p0, c.sections = sec;
    std::string secs;
    for (int32_t v : sec) secs += s(v);
    add(c, Op::Rope, DType::F32, "hd" + s(hd) + "_nd" + s(nd) + "_imrope" + secs + "_p" + s(p0));
  }
  for (auto [C, dc, T] : {std::tuple<int64_t, int32_t, int64_t>{40, 4, 5}, {512, 4, 17}, {7, 2, 1}}) {
    ConformanceCase c;
    c.k = C, c.n_dims = dc, c.m = T;
    add(c, Op::SsmConv, DType::F32, "C" + s(C) + "_dc" + s(dc) + "_T" + s(T) + "_dec1");
  }
  for (auto [S, hk, hv, T] : {std::tuple<int64_t, int32_t, int32_t, int64_t>{64, 2, 4, 9}, {32, 1, 3, 5}, {16, 2, 2, 1},
                                  // Qwen3.5-35B-A3B's head size; a size with a partial 16-lane tail
                                  {128, 2, 4, 3}, {24, 3, 6, 4}}) {
    ConformanceCase c;
    c.k = S, c.n_head = hk, c.n_kv = hv, c.m = T;
    add(c, Op::GatedDeltaNet, DType::F32, "S" + s(S) + "_hk" + s(hk) + "_hv" + s(hv) + "_T" + s(T) + "_dec1");
  }
  return cs;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// ---------------------------------------------------------------------------
// Case graphs: tensors with their initial bytes, nodes, execution steps, outputs.

// View: a view of another tensor (no storage; the base is checked and compared).
// KvK / KvV: layer KvSpec::layer's K or V storage of the instance's KV cache; Slots /
// SeqTable: the I32 inputs of KvWrite / Attention for `paged` slices, made from the
// instance's block tables (as the engine's make_paged_inputs does).
enum class Role { Input, Weight, Output, View, KvK, KvV, Slots, SeqTable };

// One sequence's part of a KvWrite / Attention step: KvSpec sequence index `seq`
// (0 for the single-sequence cases), token rows [first, first + count) at positions
// pos0 ...
struct PagedSlice {
  int seq;
  int64_t first, count, pos0;
};

struct TensorSpec {
  std::string name;
  DType type = DType::F32;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  Role role = Role::Input;
  std::vector<uint8_t> init;  // inputs and weights; outputs start as all 0xFF (NaN)
  // A view of tensor `view_of` (no storage of its own): byte strides nb[1..3], offset.
  int view_of = -1;
  std::array<size_t, 3> view_nb{};
  size_t view_offset = 0;
  std::vector<PagedSlice> paged;  // Slots and SeqTable (table columns in this order)
  int32_t window = 0;             // SeqTable of a sliding-window Attention

  size_t bytes() const {
    return view_of >= 0 || role == Role::KvK || role == Role::KvV ? 0
                                                                   : row_bytes(type, ne[0]) * size_t(ne[1] * ne[2] * ne[3]);
  }
};

// One sequence of a batched case (KvSpec::seqs): forked from `parent` at fork_at or
// a root (-1), `history` positions cached before the run, [history, history +
// written) written by the run, [0, capacity) reserved (whole pages).
struct KvSeqSpec {
  int parent = -1;
  int64_t fork_at = 0;
  int64_t history = 0;
  int64_t written = 0;
  int64_t capacity = 0;
};

struct KvSpec {
  bool used = false;
  KvCacheConfig cfg;
  int layer = 1;          // the layer the nodes use (layer 0 must stay untouched)
  int64_t history = 0;    // positions [0, history) hold cached data before the run
  int64_t written = 0;    // positions [history, history + written) are written by the run
  int64_t capacity = 0;   // reserved positions per sequence (whole pages)
  // Recurrent-state cases: the tested layer (`layer`) and sequence may change their
  // conv state (conv) and / or recurrent state (rec); every other slot stays as set up.
  bool conv = false, rec = false;
  // Batched cases: every sequence (node.i[1] is an index into this list) and the
  // reserve() calls the engine makes before the steps, in order (sequence, positions).
  // Empty for the single-sequence cases above.
  std::vector<KvSeqSpec> seqs;
  std::vector<std::pair<int, int64_t>> reserves;

  // Batched cases: the sequence whose pages hold position `pos` of sequence `s` as set
  // up (a fork reads its parent's positions below the fork point).
  int owner(int s, int64_t pos) const {
    while (seqs[size_t(s)].parent >= 0 && pos < seqs[size_t(s)].fork_at) s = seqs[size_t(s)].parent;
    return s;
  }
};

struct CaseGraph {
  std::vector<TensorSpec> tensors;
  std::vector<Node> nodes;   // node.kv is set per instance (non-null placeholder here)
  std::vector<size_t> steps; // nodes per execute() call
  // Per step, the sequences (KvSpec index) whose KV length the step extends, and to
  // what: the engine's set_length after a forward step.
  std::vector<std::vector<std::pair<int, int64_t>>> lengths;
  std::vector<int> outputs;  // tensor indices compared with the reference
  KvSpec kv;
};

KvCache* const kKvPlaceholder = reinterpret_cast<KvCache*>(uintptr_t(1));

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  int32_t integer(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng_); }
  std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }

 private:
  std::mt19937_64 rng_;
};

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

int add_spec(CaseGraph& g, std::string name, DType type, std::array<int64_t, 4> ne, Role role,
             std::vector<uint8_t> init = {}) {
  TensorSpec t;
  t.name = std::move(name);
  t.type = type;
  t.ne = ne;
  t.role = role;
  t.init = std::move(init);
  g.tensors.push_back(std::move(t));
  if (role == Role::Output) g.outputs.push_back(int(g.tensors.size()) - 1);
  return int(g.tensors.size()) - 1;
}

int f32_input(CaseGraph& g, Gen& r, std::string name, std::array<int64_t, 4> ne, float lo, float hi,
              Role role = Role::Input) {
  return add_spec(g, std::move(name), DType::F32, ne, role, to_bytes(r.floats(size_t(ne[0] * ne[1] * ne[2] * ne[3]), lo, hi)));
}

// One row of K values of type t made of random blocks: every byte random (every bit
// pattern of the quants, high bits and 6-bit sub-block scales is a valid block, so
// kernels meet all of them, -32 scales included), then the fp16 super-block scales
// set so the values are of order one (Q2_K's d and dmin positive, as a quantizer
// makes them; Q3_K's and IQ4_XS's d of either sign). For the formats the core has no
// quantizer for.
bool random_block_type(DType t) { return t == DType::Q2_K || t == DType::Q3_K || t == DType::IQ4_XS; }

void random_blocks(Gen& r, DType t, int64_t K, uint8_t* dst) {
  const size_t nb = size_t(K / quant::QK_K);
  for (size_t i = 0; i < row_bytes(t, K); ++i) dst[i] = uint8_t(r.integer(0, 255));
  auto sign = [&] { return r.integer(0, 1) ? 1.0f : -1.0f; };
  for (size_t b = 0; b < nb; ++b) {
    if (t == DType::Q2_K) {  // d * sc * q - dmin * m: sc, m <= 15, q <= 3
      auto* x = reinterpret_cast<quant::BlockQ2_K*>(dst) + b;
      x->d = quant::fp32_to_fp16(r.uniform(0.5f, 1.0f) / 32.0f);
      x->dmin = quant::fp32_to_fp16(r.uniform(0.5f, 1.0f) / 32.0f);
    } else if (t == DType::Q3_K) {  // d * (sc - 32) * q: |sc - 32| <= 32, |q| <= 4
      auto* x = reinterpret_cast<quant::BlockQ3_K*>(dst) + b;
      x->d = quant::fp32_to_fp16(sign() * r.uniform(0.5f, 1.0f) / 64.0f);
    } else {  // IQ4_XS: d * (ls - 32) * grid: |ls - 32| <= 32, |grid| <= 127
      auto* x = reinterpret_cast<quant::BlockIQ4_XS*>(dst) + b;
      x->d = quant::fp32_to_fp16(sign() * r.uniform(0.5f, 1.0f) / 2048.0f);
    }
  }
}

// A [K, rows] matrix of random floats stored as `t` (quantized row by row), or of
// random blocks for the formats without a quantizer.
int matrix_weight(CaseGraph& g, Gen& r, std::string name, DType t, int64_t K, int64_t rows) {
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> bytes(rb * size_t(rows));
  for (int64_t i = 0; i < rows; ++i) {
    if (random_block_type(t)) {
      random_blocks(r, t, K, bytes.data() + size_t(i) * rb);
      continue;
    }
    std::vector<float> f = r.floats(size_t(K), -1.0f, 1.0f);
    quant::quantize_row(t, f.data(), bytes.data() + size_t(i) * rb, K);
  }
  return add_spec(g, std::move(name), t, {K, rows, 1, 1}, Role::Weight, std::move(bytes));
}

Node node(Op op, int dst, int s0, int s1 = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src[0] = s0;
  n.src[1] = s1;
  return n;
}

// The KV storage tensors of the case's layer (one each per case).
std::pair<int, int> kv_storage_specs(CaseGraph& g) {
  for (size_t i = 0; i < g.tensors.size(); ++i)
    if (g.tensors[i].role == Role::KvK) return {int(i), int(i) + 1};
  const std::array<int64_t, 4> ne{int64_t(g.kv.cfg.n_kv_heads) * g.kv.cfg.head_dim, g.kv.cfg.page_tokens,
                                  g.kv.cfg.n_pages, 1};
  const int k = add_spec(g, "k_cache", DType::F16, ne, Role::KvK);
  std::array<int64_t, 4> v_ne = ne;
  if (g.kv.cfg.v_in_k > 0) v_ne[0] = g.kv.cfg.v_in_k;
  add_spec(g, "v_cache", DType::F16, v_ne, Role::KvV);
  return {k, k + 1};
}

// One step of paged nodes over `slices` (rows of k, v and q in row order; the sequence
// table lists them in `columns` order, padded as the engine pads it): a KvWrite of k
// and of v, then (q >= 0) an Attention of q into y, as models/decoder_blocks.cpp's
// paged_attention builds them. Records the step and the lengths it leaves.
void paged_step(CaseGraph& g, const std::vector<PagedSlice>& slices, const std::vector<PagedSlice>& columns, int q,
                int k, int v, int y, float scale, const std::string& sfx, int32_t window = 0, int sinks = -1) {
  const auto [kc, vc] = kv_storage_specs(g);
  int64_t n = 0, max_pages = 1;
  const int64_t pt = g.kv.cfg.page_tokens;
  for (const PagedSlice& sl : slices) {
    n += sl.count;
    max_pages = std::max(max_pages, (sl.pos0 + sl.count + pt - 1) / pt);
  }
  const int slots = add_spec(g, "slots" + sfx, DType::I32, {n, 1, 1, 1}, Role::Slots);
  g.tensors[size_t(slots)].paged = slices;
  g.nodes.push_back(node(Op::KvWrite, kc, k, slots));
  size_t count = 1;
  if (v >= 0) {  // no V write where V is read out of K's rows
    g.nodes.push_back(node(Op::KvWrite, vc, v, slots));
    ++count;
  }
  if (q >= 0) {
    const int64_t seqs = int64_t(std::bit_ceil(uint64_t(columns.size())));
    const int64_t pages = int64_t(std::bit_ceil(uint64_t(max_pages)));
    const int table = add_spec(g, "seq_table" + sfx, DType::I32, {kSeqTableHeader + pages, seqs, 1, 1}, Role::SeqTable);
    g.tensors[size_t(table)].paged = columns;
    g.tensors[size_t(table)].window = window;
    Node a = node(Op::Attention, y, q, kc);
    a.src[2] = vc;
    a.src[3] = table;
    a.f[0] = scale;
    a.i[0] = window;
    a.src[4] = sinks;
    g.nodes.push_back(a);
    ++count;
  }
  g.steps.push_back(count);
  std::vector<std::pair<int, int64_t>> lengths;
  for (const PagedSlice& sl : slices) lengths.push_back({sl.seq, sl.pos0 + sl.count});
  g.lengths.push_back(std::move(lengths));
}

// Batched attention (see batch_layout): per step one q, k, v and dst for the whole
// batch, and one KvWrite pair and one Attention over every slice, as
// models/decoder_blocks.cpp's paged_attention builds them. Step 1's sequence table
// lists the slices in batch order, as the engine does; step 2's in reverse, so a
// kernel that assumes columns in row order computes the wrong rows.
void build_batched_attention(const ConformanceCase& c, CaseGraph& g, Gen& r) {
  const int64_t K = c.k;
  const int32_t P = c.page;
  const BatchLayout l = batch_layout(c.n, P);
  g.kv.used = true;
  g.kv.cfg.n_layers = 2;
  g.kv.cfg.n_kv_heads = c.n_kv;
  g.kv.cfg.head_dim = int(K);
  g.kv.cfg.page_tokens = P;
  std::vector<int64_t> pos;  // next position per sequence
  int pages = 2;
  for (const BatchSeq& b : l.seqs) {
    KvSeqSpec s;
    s.parent = b.parent;
    s.fork_at = b.fork_at;
    s.history = b.history;
    s.written = 1;  // step 2
    for (const BatchSlice& sl : l.step1)
      if (sl.seq == int(g.kv.seqs.size())) s.written += sl.count;
    s.capacity = (s.history + s.written + P - 1) / P * P;
    pages += int(s.capacity / P);  // more than enough: forks share some
    g.kv.seqs.push_back(s);
    pos.push_back(s.history);
  }
  g.kv.cfg.n_pages = pages;

  auto step = [&](const std::vector<BatchSlice>& slices, bool reverse, const std::string& sfx) {
    int64_t n = 0;
    std::vector<PagedSlice> rows;
    for (const BatchSlice& sl : slices) {
      rows.push_back({sl.seq, n, sl.count, pos[size_t(sl.seq)]});
      n += sl.count;
      g.kv.reserves.push_back({sl.seq, pos[size_t(sl.seq)] + sl.count});
    }
    std::vector<PagedSlice> columns = rows;
    if (reverse) std::reverse(columns.begin(), columns.end());
    int q = f32_input(g, r, "q" + sfx, {K, c.n_head, n, 1}, -1.0f, 1.0f);
    int k = f32_input(g, r, "k" + sfx, {K, c.n_kv, n, 1}, -1.0f, 1.0f);
    int v = f32_input(g, r, "v" + sfx, {K, c.n_kv, n, 1}, -1.0f, 1.0f);
    int y = add_spec(g, "dst" + sfx, DType::F32, {K, c.n_head, n, 1}, Role::Output);
    paged_step(g, rows, columns, q, k, v, y, 1.0f / std::sqrt(float(K)), sfx);
    for (const BatchSlice& sl : slices) pos[size_t(sl.seq)] += sl.count;
  };
  step(l.step1, false, "_batch");
  std::vector<BatchSlice> decode;
  for (int s : l.step2) decode.push_back({s, 1});
  step(decode, true, "_decode");
}

CaseGraph build_case(const ConformanceCase& c) {
  CaseGraph g;
  Gen r(c.seed);
  const int64_t K = c.k, N = c.n, M = c.m;
  switch (c.kind) {
    case Op::MatMul: {
      int w = matrix_weight(g, r, "weight", c.type, K, N);
      int x = f32_input(g, r, "x", {K, M, 1, 1}, -1.0f, 1.0f);
      int y = add_spec(g, "dst", DType::F32, {N, M, 1, 1}, Role::Output);
      g.nodes.push_back(node(Op::MatMul, y, w, x));
      break;
    }
    case Op::GetRows: {
      int tab = matrix_weight(g, r, "table", c.type, K, N);
      std::vector<int32_t> ids(static_cast<size_t>(M));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = r.integer(0, int32_t(N) - 1);
      if (M >= 3) ids[0] = int32_t(N) - 1, ids[1] = 0, ids[2] = ids[0];  // last row, first row, a repeat
      int id = add_spec(g, "ids", DType::I32, {M, 1, 1, 1}, Role::Input, to_bytes(ids));
      int y = add_spec(g, "dst", DType::F32, {K, M, 1, 1}, Role::Output);
      g.nodes.push_back(node(Op::GetRows, y, tab, id));
      break;
    }
    case Op::RmsNorm: {
      int x = f32_input(g, r, "x", {K, N, 1, 1}, -1.5f, 2.5f);
      int w = c.flag ? f32_input(g, r, "weight", {K, 1, 1, 1}, -2.0f, 2.0f, Role::Weight) : -1;
      int y = add_spec(g, "dst", DType::F32, {K, N, 1, 1}, Role::Output);
      Node n = node(Op::RmsNorm, y, x, w);
      n.f[0] = 1e-5f;
      g.nodes.push_back(n);
      break;
    }
    case Op::Rope: {
      int x = f32_input(g, r, "x", {K, N, M, 1}, -1.0f, 1.0f);
      std::vector<int32_t> pos(static_cast<size_t>(M));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = c.pos0 + int32_t(i);
      int p = add_spec(g, "pos", DType::I32, {M, 1, 1, 1}, Role::Input, to_bytes(pos));
      int y = add_spec(g, "dst", DType::F32, {K, N, M, 1}, Role::Output);
      int factors = -1;
      if (c.flag) {
        // Llama 3.1's shape: 1 for the high frequencies, up to 8 for the low ones, smooth between.
        std::vector<float> fac(static_cast<size_t>(c.n_dims / 2));
        for (size_t i = 0; i < fac.size(); ++i)
          fac[i] = 1.0f + 7.0f * float(i) / float(fac.size() > 1 ? fac.size() - 1 : 1) * float(i % 3 + 1) / 3.0f;
        factors = add_spec(g, "factors", DType::F32, {c.n_dims / 2, 1, 1, 1}, Role::Input, to_bytes(fac));
      }
      Node n = node(Op::Rope, y, x, p);
      n.src[2] = factors;
      n.i[0] = c.n_dims;
      n.i[1] = c.mode;
      if (c.mode == kRopeImrope)
        for (int j = 0; j < 4; ++j) n.i[size_t(2 + j)] = c.sections[size_t(j)];
      n.f[0] = 10000.0f;
      n.f[1] = c.freq_scale;
      if (c.yarn_ctx > 0) {
        n.f[2] = 1.0f;
        n.f[3] = 1.0f;
        int32_t dims[2];
        rope_yarn_corr_dims(c.n_dims, c.yarn_ctx, n.f[0], 32.0f, 1.0f, dims);
        n.i[6] = dims[0];
        n.i[7] = dims[1];
      }
      g.nodes.push_back(n);
      break;
    }
    case Op::Softmax:
    case Op::Sigmoid:
    case Op::Softplus:
    case Op::Silu: {
      // Softplus spans its cutoff at 20; the others their interesting range.
      const float a = c.kind == Op::Softmax ? 4.0f : c.kind == Op::Softplus ? 30.0f : 6.0f;
      int x = f32_input(g, r, "x", {K, N, M, 1}, -a, a);
      int y = add_spec(g, "dst", DType::F32, {K, N, M, 1}, Role::Output);
      g.nodes.push_back(node(c.kind, y, x));
      break;
    }
    case Op::SwiGlu:
    case Op::GeGlu:
    case Op::SwiGluOai:
    case Op::Add:
    case Op::Mul: {
      // GeGlu's gate spans GELU's cutoffs at -10 and 10, SwiGluOai's its clamp at 7.
      const float a0 = c.kind == Op::GeGlu ? 12.0f : c.kind == Op::SwiGluOai ? 9.0f : 4.0f;
      int a = f32_input(g, r, "src0", {K, N, M, 1}, -a0, a0);
      int b = c.flag ? f32_input(g, r, "src1", {K, 1, 1, 1}, -2.0f, 2.0f)
                     : f32_input(g, r, "src1", {K, N, M, 1}, -2.0f, 2.0f);
      int y = add_spec(g, "dst", DType::F32, {K, N, M, 1}, Role::Output);
      Node n = node(c.kind, y, a, b);
      if (c.kind == Op::SwiGluOai) n.f[0] = 1.702f, n.f[1] = 7.0f;
      g.nodes.push_back(n);
      break;
    }
    case Op::Argmax: {
      std::vector<float> v(size_t(K * N));
      for (float& x : v) x = c.flag ? std::round(r.uniform(-1.0f, 1.0f) * 4.0f) / 4.0f : r.uniform(-10.0f, 10.0f);
      int x = add_spec(g, "x", DType::F32, {K, N, 1, 1}, Role::Input, to_bytes(v));
      int y = add_spec(g, "dst", DType::I32, {N, 1, 1, 1}, Role::Output);
      g.nodes.push_back(node(Op::Argmax, y, x));
      break;
    }
    case Op::KvWrite:
    case Op::Attention: {
      if (c.kind == Op::Attention && c.flag) {
        build_batched_attention(c, g, r);
        break;
      }
      const bool attn = c.kind == Op::Attention;
      const int64_t written = attn ? M + 1 : M;
      g.kv.used = true;
      g.kv.history = c.pos0;
      g.kv.written = written;
      const int64_t total = c.pos0 + written;
      const int64_t pages = (total + c.page - 1) / c.page;
      g.kv.capacity = pages * c.page;
      g.kv.cfg.n_layers = 2;
      g.kv.cfg.n_kv_heads = c.n_kv;
      g.kv.cfg.head_dim = int(K);
      g.kv.cfg.page_tokens = c.page;
      g.kv.cfg.n_pages = int(2 * pages);
      g.kv.cfg.v_in_k = c.latent;
      const int64_t dv = c.latent > 0 ? c.latent : K;
      const float scale = 1.0f / std::sqrt(float(K));
      // Sinks of either sign and size: some dominate the scores (|q.k| scale <= ~8), some vanish.
      const int sinks = c.sinks ? f32_input(g, r, "sinks", {c.n_head, 1, 1, 1}, -6.0f, 6.0f, Role::Weight) : -1;
      auto step = [&](int64_t T, int64_t p0, bool with_attention, const char* sfx) {
        int k = f32_input(g, r, std::string("k") + sfx, {K, c.n_kv, T, 1}, -1.0f, 1.0f);
        int v = c.latent > 0 ? -1 : f32_input(g, r, std::string("v") + sfx, {K, c.n_kv, T, 1}, -1.0f, 1.0f);
        int q = -1, y = -1;
        if (with_attention) {
          q = f32_input(g, r, std::string("q") + sfx, {K, c.n_head, T, 1}, -1.0f, 1.0f);
          y = add_spec(g, std::string("dst") + sfx, DType::F32, {dv, c.n_head, T, 1}, Role::Output);
        }
        const std::vector<PagedSlice> one{{0, 0, T, p0}};
        paged_step(g, one, one, q, k, v, y, scale, sfx, c.window, sinks);
      };
      if (!attn) {
        step(M, c.pos0, false, "");
      } else {
        step(M, c.pos0, true, "_prefill");
        step(1, c.pos0 + M, true, "_decode");
      }
      break;
    }
    case Op::Concat: {  // c.k + c.n values per row, c.m rows (as [.., 3, m / 3] where it divides)
      const int64_t r1 = M % 3 == 0 ? 3 : 1, r2 = M / r1;
      int a = f32_input(g, r, "a", {K, r1, r2, 1}, -1.0f, 1.0f);
      int b = f32_input(g, r, "b", {N, r1, r2, 1}, -1.0f, 1.0f);
      int y = add_spec(g, "dst", DType::F32, {K + N, r1, r2, 1}, Role::Output);
      g.nodes.push_back(node(Op::Concat, y, a, b));
      break;
    }
    case Op::GroupLimit: {  // c.k experts, c.n rows: router sigmoids plus a bias
      std::vector<float> v(size_t(K * N));
      for (float& x : v) x = r.uniform(0.0f, 1.2f);
      if (c.flag)  // groups 1 and 2 of every row score alike (the same two values)
        for (int64_t t = 0; t < N; ++t) {
          const int64_t per = K / c.n_head;
          for (int64_t e = 0; e < per; ++e) v[size_t(t * K + 2 * per + e)] = v[size_t(t * K + per + e)];
        }
      int x = add_spec(g, "x", DType::F32, {K, N, 1, 1}, Role::Input, to_bytes(v));
      int y = add_spec(g, "dst", DType::F32, {K, N, 1, 1}, Role::Output);
      Node n = node(Op::GroupLimit, y, x);
      n.i[0] = c.n_head;
      n.i[1] = c.n_kv;
      g.nodes.push_back(n);
      break;
    }
    case Op::NormalizeRows: {  // values as a router's sigmoids: in (0, 1), or tiny
      const float hi = c.flag ? 1e-5f : 1.0f;
      int x = f32_input(g, r, "x", {K, N, 1, 1}, hi * 1e-3f, hi);
      int y = add_spec(g, "dst", DType::F32, {K, N, 1, 1}, Role::Output);
      Node n = node(Op::NormalizeRows, y, x);
      n.f[0] = 2.5f;
      n.f[1] = 6.103515625e-5f;
      g.nodes.push_back(n);
      break;
    }
    case Op::TopK: {  // c.k experts, c.m chosen, c.n tokens
      std::vector<float> v(size_t(K * N));
      for (float& x : v) x = c.flag ? std::round(r.uniform(-1.0f, 1.0f) * 2.0f) / 2.0f : r.uniform(-5.0f, 5.0f);
      int x = add_spec(g, "logits", DType::F32, {K, N, 1, 1}, Role::Input, to_bytes(v));
      int y = add_spec(g, "ids", DType::I32, {M, N, 1, 1}, Role::Output);
      g.nodes.push_back(node(Op::TopK, y, x));
      break;
    }
    case Op::GatherCols: {
      int x = f32_input(g, r, "x", {K, N, 1, 1}, -5.0f, 5.0f);
      std::vector<int32_t> ids(size_t(M * N));
      for (auto& i : ids) i = r.integer(0, int32_t(K) - 1);
      int id = add_spec(g, "ids", DType::I32, {M, N, 1, 1}, Role::Input, to_bytes(ids));
      int y = add_spec(g, "dst", DType::F32, {M, N, 1, 1}, Role::Output);
      g.nodes.push_back(node(Op::GatherCols, y, x, id));
      break;
    }
    case Op::MatMulId: {  // K inputs, N rows, c.n_head experts, c.n_kv chosen, M tokens
      const int64_t E = c.n_head, k = c.n_kv, b = c.flag ? k : 1;
      int w = matrix_weight(g, r, "experts", c.type, K, N * E);
      g.tensors[size_t(w)].ne = {K, N, E, 1};
      int x = f32_input(g, r, "x", {K, b, M, 1}, -1.0f, 1.0f);
      std::vector<int32_t> ids(size_t(k * M));
      for (int64_t t = 0; t < M; ++t)  // k distinct experts per token
        for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = int32_t((t + j * 3) % E);
      int id = add_spec(g, "ids", DType::I32, {k, M, 1, 1}, Role::Input, to_bytes(ids));
      int y = add_spec(g, "dst", DType::F32, {N, k, M, 1}, Role::Output);
      Node n = node(Op::MatMulId, y, w, x);
      n.src[2] = id;
      g.nodes.push_back(n);
      break;
    }
    case Op::MoeCombine: {  // c.k outputs, c.m experts per token, c.n tokens
      int e = f32_input(g, r, "experts", {K, M, N, 1}, -2.0f, 2.0f);
      int w = f32_input(g, r, "weights", {M, N, 1, 1}, 0.0f, 1.0f);
      int y = add_spec(g, "dst", DType::F32, {K, N, 1, 1}, Role::Output);
      g.nodes.push_back(node(Op::MoeCombine, y, e, w));
      break;
    }
    case Op::Cont: {  // every other K-block of a [2K, N, M] source, starting at 0 or K
      int src = f32_input(g, r, "src", {2 * K, N, M, 1}, -3.0f, 3.0f);
      int v = add_spec(g, "view", DType::F32, {K, N, M, 1}, Role::Input);
      TensorSpec& vs = g.tensors[size_t(v)];
      vs.view_of = src;
      vs.view_nb = {size_t(2 * K) * 4, size_t(2 * K * N) * 4, size_t(2 * K * N * M) * 4};
      vs.view_offset = c.flag ? size_t(K) * 4 : 0;
      int y = add_spec(g, "dst", DType::F32, {K, N, M, 1}, Role::Output);
      g.nodes.push_back(node(Op::Cont, y, v));
      break;
    }
    case Op::SsmConv:
    case Op::GatedDeltaNet: {
      // A prefill of M tokens, then one more token, from a non-zero state.
      const bool conv = c.kind == Op::SsmConv;
      const int64_t S = c.k, hk = c.n_head, hv = c.n_kv, C = conv ? c.k : (2 * hk + hv) * S;
      g.kv.used = true;
      g.kv.conv = conv;
      g.kv.rec = !conv;
      g.kv.cfg.n_layers = 1, g.kv.cfg.n_kv_heads = 1, g.kv.cfg.head_dim = 1, g.kv.cfg.page_tokens = 4;
      g.kv.cfg.n_pages = 2;
      g.kv.capacity = 4;
      g.kv.cfg.recurrent.n_layers = 2;
      // Both state kinds exist in every case, so each op is also checked for leaving the other alone.
      g.kv.cfg.recurrent.conv_elems = conv ? (c.n_dims - 1) * C : 3 * C;
      g.kv.cfg.recurrent.state_elems = conv ? 16 : S * S * hv;
      int w = conv ? f32_input(g, r, "kernel", {c.n_dims, C, 1, 1}, -1.0f, 1.0f, Role::Weight) : -1;
      for (int step = 0; step < 2; ++step) {
        const int64_t T = step == 0 ? M : 1;
        const std::string sfx = step == 0 ? "_prefill" : "_decode";
        Node n;
        n.op = c.kind;
        n.kv = kKvPlaceholder;
        n.i[0] = g.kv.layer;
        if (conv) {
          int x = f32_input(g, r, "x" + sfx, {C, T, 1, 1}, -2.0f, 2.0f);
          n.dst = add_spec(g, "dst" + sfx, DType::F32, {C, T, 1, 1}, Role::Output);
          n.src = {x, w, -1, -1, -1};
        } else {
          int qkv = f32_input(g, r, "qkv" + sfx, {C, T, 1, 1}, -1.0f, 1.0f);
          int gl = f32_input(g, r, "g" + sfx, {hv, T, 1, 1}, -2.0f, -0.01f);
          int b = f32_input(g, r, "beta" + sfx, {hv, T, 1, 1}, 0.05f, 0.95f);
          n.dst = add_spec(g, "dst" + sfx, DType::F32, {S, hv, T, 1}, Role::Output);
          n.src = {qkv, gl, b, -1, -1};
          n.i[2] = hk;
          n.i[3] = int32_t(S);
          n.f[0] = 1e-6f;
        }
        g.nodes.push_back(n);
        g.steps.push_back(1);
      }
      break;
    }
    case Op::Count: throw Error("conformance: bad case op");
  }
  if (g.steps.empty()) g.steps = {g.nodes.size()};
  return g;
}

// ---------------------------------------------------------------------------
// Guarded host memory: the tensor's bytes sit between guard regions filled with a
// known pattern, 64-byte aligned.

constexpr size_t kGuardBytes = 256;
inline uint8_t guard_byte(size_t i) { return uint8_t(0xA5 ^ (i * 29)); }

class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes), mem_(kGuardBytes + 64 + bytes + kGuardBytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(mem_.data()) + kGuardBytes;
    off_ = kGuardBytes + (64 - p % 64) % 64;
    for (size_t i = 0; i < off_; ++i) mem_[i] = guard_byte(i);
    for (size_t i = off_ + bytes_; i < mem_.size(); ++i) mem_[i] = guard_byte(i);
  }
  uint8_t* data() { return mem_.data() + off_; }
  const uint8_t* data() const { return mem_.data() + off_; }
  size_t size() const { return bytes_; }

  // Empty when the guards are intact, else what was overwritten.
  std::string check(const std::string& name) const {
    std::string msg;
    // Before: the byte nearest the tensor that differs.
    for (size_t i = off_; i-- > 0;)
      if (mem_[i] != guard_byte(i)) {
        msg = "guard bytes breached: wrote " + std::to_string(off_ - i) + " byte(s) before the start of '" + name + "'";
        break;
      }
    for (size_t i = mem_.size(); i-- > off_ + bytes_;)
      if (mem_[i] != guard_byte(i)) {
        if (!msg.empty()) msg += "; ";
        msg += "guard bytes breached: wrote up to " + std::to_string(i - off_ - bytes_ + 1) +
               " byte(s) past the end of '" + name + "' (" + std::to_string(bytes_) + " bytes)";
        break;
      }
    return msg;
  }

 private:
  size_t bytes_;
  std::vector<uint8_t> mem_;
  size_t off_ = 0;
};

// The KV cache bytes every position starts with (history and bystanders): finite F16.
uint16_t kv_init(int seq, int layer, int64_t pos, int kvsel, int64_t e) {
  const uint64_t h = mix((uint64_t(seq) << 48) ^ (uint64_t(layer) << 40) ^ (uint64_t(pos) << 20) ^
                         (uint64_t(kvsel) << 19) ^ uint64_t(e));
  return quant::fp32_to_fp16(float(h & 0xFFFF) / 32768.0f - 1.0f);
}

// The recurrent state every slot starts with: small finite values.
float rec_init(int seq, int layer, int kind, int64_t e) {
  const uint64_t h = mix((uint64_t(seq) << 48) ^ (uint64_t(layer) << 40) ^ (uint64_t(kind) << 36) ^ uint64_t(e));
  return float(h & 0xFFFF) / 65536.0f - 0.5f;
}

// One backend's copy of a case graph.
struct Instance {
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;  // parallel to spec.tensors
  std::vector<int32_t> index;  // spec tensor -> graph tensor (row views add reshapes)
  std::unique_ptr<KvCache> kv;
  KvCache::SeqId seq = -1, other_seq = -1;
  std::vector<KvCache::SeqId> seqs;  // batched cases: per KvSpec::seqs entry
  std::map<size_t, std::vector<uint8_t>> made;  // Slots / SeqTable bytes as instantiated, by spec tensor
  Graph graph;
};

// 2 (K and V), or 1 where V is read out of K's rows (latent attention).
int kv_planes(const KvCache& kv) { return kv.config().v_in_k > 0 ? 1 : 2; }

// Fills positions [from, to) of sequence `s` (every layer) with kv_init(tag, ...).
void fill_kv(KvCache& kv, KvCache::SeqId s, int tag, int64_t from, int64_t to) {
  const int64_t row = int64_t(kv.row_elems());
  for (int layer = 0; layer < kv.config().n_layers; ++layer)
    for (int64_t pos = from; pos < to; ++pos) {
      std::vector<uint16_t> k(static_cast<size_t>(row)), v(static_cast<size_t>(row));
      for (int64_t e = 0; e < row; ++e) {
        k[size_t(e)] = kv_init(tag, layer, pos, 0, e);
        v[size_t(e)] = kv_init(tag, layer, pos, 1, e);
      }
      kv.write_row(layer, s, pos, 0, k.data());
      if (kv.config().v_in_k == 0) kv.write_row(layer, s, pos, 1, v.data());
    }
}

// Batched cases: create and fork the sequences, cache their histories (a fork's own
// positions only: below the fork point it reads its parent's pages), make the
// engine's reserve() calls (which copy shared pages about to be written), reserve
// whole pages and give every position not yet written a known value.
void setup_batched_kv(const KvSpec& spec, KvCache& kv, std::vector<KvCache::SeqId>& ids) {
  for (size_t i = 0; i < spec.seqs.size(); ++i) {
    const KvSeqSpec& s = spec.seqs[i];
    const KvCache::SeqId id = s.parent < 0 ? kv.create_sequence() : kv.fork_sequence(ids.at(size_t(s.parent)), s.fork_at);
    ids.push_back(id);
    const int64_t from = s.parent < 0 ? 0 : s.fork_at;
    if (s.history > from) {
      if (!kv.reserve(id, s.history)) throw Error("conformance: KV pool too small");
      fill_kv(kv, id, int(i), from, s.history);
    }
    kv.set_length(id, s.history);
  }
  for (auto [i, n] : spec.reserves)
    if (!kv.reserve(ids.at(size_t(i)), n)) throw Error("conformance: KV pool too small");
  const int64_t page = kv.config().page_tokens;
  for (size_t i = 0; i < spec.seqs.size(); ++i) {
    const KvSeqSpec& s = spec.seqs[i];
    if (!kv.reserve(ids[i], s.capacity)) throw Error("conformance: KV pool too small");
    // The case is what it claims: a fork still shares its parent's first page, one
    // forked inside a page has its own copy of that page by now, and no page the run
    // writes (or reserved past it) is shared.
    const auto& table = kv.block_table(ids[i]);
    if (s.parent >= 0 && s.fork_at > 0) {
      const auto& parent = kv.block_table(ids[size_t(s.parent)]);
      const size_t mid = size_t(s.fork_at / page);
      if (table.front() != parent.front() || (s.fork_at % page != 0 && table.at(mid) == parent.at(mid)))
        throw Error("conformance: internal error: fork " + std::to_string(i) + " does not share (or copy) its parent's pages");
    }
    for (size_t p = size_t(s.history / page); p < table.size(); ++p)
      if (kv.page_refcount(table[p]) != 1)
        throw Error("conformance: internal error: sequence " + std::to_string(i) + " would write a shared page");
    fill_kv(kv, ids[i], int(i), s.history, s.capacity);
  }
}

std::unique_ptr<Instance> instantiate(const CaseGraph& spec, Backend& be) {
  auto inst = std::make_unique<Instance>();
  // The KV pages in the tested backend's memory, as the engine allocates them.
  const KvCache::StorageAlloc kv_alloc = [&be](size_t bytes) { return be.alloc_buffer(bytes, BufferUsage::Kv); };
  if (spec.kv.used && !spec.kv.seqs.empty()) {
    inst->kv = std::make_unique<KvCache>(spec.kv.cfg, kv_alloc);
    setup_batched_kv(spec.kv, *inst->kv, inst->seqs);
  } else if (spec.kv.used) {
    inst->kv = std::make_unique<KvCache>(spec.kv.cfg, kv_alloc);
    KvCache& kv = *inst->kv;
    inst->other_seq = kv.create_sequence();
    inst->seq = kv.create_sequence();
    // Interleave the two sequences' pages so the tested one's block table is not
    // contiguous.
    const int page = spec.kv.cfg.page_tokens;
    for (int64_t p = page; p <= spec.kv.capacity; p += page) {
      if (!kv.reserve(inst->seq, p) || !kv.reserve(inst->other_seq, p)) throw Error("conformance: KV pool too small");
    }
    const int64_t row = int64_t(kv.row_elems());
    for (KvCache::SeqId s : {inst->seq, inst->other_seq})
      for (int layer = 0; layer < spec.kv.cfg.n_layers; ++layer)
        for (int64_t pos = 0; pos < spec.kv.capacity; ++pos) {
          std::vector<uint16_t> k(static_cast<size_t>(row)), v(static_cast<size_t>(row));
          for (int64_t e = 0; e < row; ++e) {
            k[size_t(e)] = kv_init(int(s), layer, pos, 0, e);
            v[size_t(e)] = kv_init(int(s), layer, pos, 1, e);
          }
          kv.write_row(layer, s, pos, 0, k.data());
          if (kv.config().v_in_k == 0) kv.write_row(layer, s, pos, 1, v.data());
        }
    kv.set_length(inst->seq, spec.kv.history);
    const RecurrentStateConfig& rc = spec.kv.cfg.recurrent;
    for (KvCache::SeqId s : {inst->seq, inst->other_seq})
      for (int layer = 0; layer < rc.n_layers; ++layer) {
        float* cs = kv.conv_state(layer, s);
        float* rs = kv.recurrent_state(layer, s);
        for (int64_t e = 0; e < rc.conv_elems; ++e) cs[e] = rec_init(int(s), layer, 0, e);
        for (int64_t e = 0; e < rc.state_elems; ++e) rs[e] = rec_init(int(s), layer, 1, e);
      }
  }
  // The instance's sequence of a KvSpec index.
  auto seq_id = [&](int i) { return spec.kv.seqs.empty() ? inst->seq : inst->seqs.at(size_t(i)); };
  for (const TensorSpec& ts : spec.tensors) {
    if (ts.role == Role::KvK || ts.role == Role::KvV) {  // the cache's own storage
      const Tensor& st = ts.role == Role::KvK ? inst->kv->k_storage(spec.kv.layer) : inst->kv->v_storage(spec.kv.layer);
      inst->index.push_back(inst->graph.add_tensor(st));
      inst->bufs.push_back(std::make_unique<GuardedBuffer>(0));
      continue;
    }
    auto buf = std::make_unique<GuardedBuffer>(ts.bytes());
    if (ts.role == Role::Slots || ts.role == Role::SeqTable) {  // from this instance's block tables
      auto* out = reinterpret_cast<int32_t*>(buf->data());
      const int64_t rows = ts.ne[0];
      if (ts.role == Role::SeqTable) std::fill(out, out + rows * ts.ne[1], -1);
      for (size_t c = 0; c < size_t(ts.ne[1]) && ts.role == Role::SeqTable; ++c) {
        int32_t* col = out + c * size_t(rows);
        col[kSeqFirst] = col[kSeqCount] = col[kSeqPos0] = 0;
        if (c >= ts.paged.size()) continue;
        const PagedSlice& sl = ts.paged[c];
        col[kSeqFirst] = int32_t(sl.first);
        col[kSeqCount] = int32_t(sl.count);
        col[kSeqPos0] = int32_t(sl.pos0);
        const auto& bt = inst->kv->block_table(seq_id(sl.seq));
        const int64_t pt = spec.kv.cfg.page_tokens, pages = (sl.pos0 + sl.count + pt - 1) / pt;
        // Pages wholly before a sliding window stay -1, as the engine leaves released ones.
        const int64_t seen = ts.window > 0 ? std::max<int64_t>(0, sl.pos0 - ts.window + 1) : 0;
        for (int64_t p = seen / pt; p < pages; ++p) col[kSeqTableHeader + p] = bt.at(size_t(p));
      }
      if (ts.role == Role::Slots)
        for (const PagedSlice& sl : ts.paged)
          for (int64_t t = 0; t < sl.count; ++t) out[sl.first + t] = inst->kv->slot(seq_id(sl.seq), sl.pos0 + t);
      const auto* bytes = reinterpret_cast<const uint8_t*>(out);
      inst->made[inst->bufs.size()] = std::vector<uint8_t>(bytes, bytes + ts.bytes());
    } else if (ts.bytes() == 0) {
      // nothing to fill (and no pointer to fill it through)
    } else if (ts.role == Role::Output) {
      std::memset(buf->data(), 0xFF, ts.bytes());  // NaN / -1: an unwritten element shows
    } else {
      std::memcpy(buf->data(), ts.init.data(), ts.bytes());
    }
    Tensor t = Tensor::contiguous(ts.type, {ts.ne[0], ts.ne[1], ts.ne[2], ts.ne[3]}, buf->data());
    if (ts.view_of >= 0) {  // the source was created before the view
      t.data = inst->bufs[size_t(ts.view_of)]->data() + ts.view_offset;
      for (int d = 1; d < Tensor::kMaxDims; ++d) t.nb[d] = ts.view_nb[size_t(d - 1)];
    }
    t.name = ts.name;
    if (ts.role == Role::Weight) be.prepare_weight(t);
    inst->index.push_back(inst->graph.add_tensor(t));
    inst->bufs.push_back(std::move(buf));
  }
  for (Node n : spec.nodes) {
    if (n.kv) {
      n.kv = inst->kv.get();
      n.i[1] = spec.kv.seqs.empty() ? inst->seq : inst->seqs.at(size_t(n.i[1]));
    }
    if (n.dst >= 0) n.dst = inst->index.at(size_t(n.dst));
    for (int32_t& src : n.src)
      if (src >= 0) src = inst->index.at(size_t(src));
    inst->graph.add_node(n);
  }
  inst->graph.allocate();
  return inst;
}

// Runs the steps. After each, as the engine does after a forward step, every
// sequence the step wrote gets its length set to the end of what it wrote (kernels do
// not set lengths).
void execute(const CaseGraph& spec, Instance& inst, Backend& be) {
  size_t first = 0;
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    be.execute(inst.graph, first, spec.steps[i]);
    if (i < spec.lengths.size())
      for (auto [seq, end] : spec.lengths[i]) {
        const KvCache::SeqId id = spec.kv.seqs.empty() ? inst.seq : inst.seqs.at(size_t(seq));
        if (inst.kv->length(id) < end) inst.kv->set_length(id, end);
      }
    first += spec.steps[i];
  }
}

std::string fmt_double(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

struct Compared {
  double nmse = 0.0;
  double limit = 0.0;
  double max_err = 0.0;  // largest |got - ref| / RMS(ref)
  double max_err_limit = 0.0;
  size_t max_at = 0;
  std::string error;  // a hard failure (non-finite, mismatch)
};

Compared compare_floats(const float* ref, const float* got, size_t n, ConformanceLimits lim, const std::string& what) {
  // An infinity where the reference has the same one (GroupLimit's masked experts) is
  // an exact match; the metrics are then taken over the other elements.
  std::vector<float> ref_finite, got_finite;
  for (size_t i = 0; i < n; ++i)
    if (std::isinf(ref[i]) && got[i] == ref[i]) {
      for (size_t j = 0; j < n; ++j)
        if (!(std::isinf(ref[j]) && got[j] == ref[j])) ref_finite.push_back(ref[j]), got_finite.push_back(got[j]);
      return compare_floats(ref_finite.data(), got_finite.data(), ref_finite.size(), lim, what);
    }
  Compared c;
  c.limit = lim.nmse;
  c.max_err_limit = lim.element;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) {
      c.error = what + ": non-finite value " + std::to_string(got[i]) + " at element " + std::to_string(i) +
                (std::isnan(got[i]) ? " (NaN; unwritten outputs start as NaN)" : "");
      c.nmse = std::numeric_limits<double>::infinity();
      return c;
    }
    if (!std::isfinite(ref[i])) {
      c.error = what + ": the reference produced a non-finite value at element " + std::to_string(i);
      c.nmse = std::numeric_limits<double>::infinity();
      return c;
    }
  }
  c.nmse = nmse(ref, got, n);
  double ss = 0.0, worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    ss += double(ref[i]) * double(ref[i]);
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (d > worst) worst = d, c.max_at = i;
  }
  const double rms = n ? std::sqrt(ss / double(n)) : 0.0;
  c.max_err = rms > 0 ? worst / rms : (worst > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  return c;
}

// NMSE and element limits checked; the first violation becomes the error.
void check_limits(Compared& c, const std::string& what, const float* ref, const float* got) {
  if (!c.error.empty()) return;
  if (c.nmse > c.limit) {
    c.error = what + ": NMSE " + fmt_double(c.nmse) + " > " + fmt_double(c.limit);
  } else if (c.max_err > c.max_err_limit) {
    char b[160];
    std::snprintf(b, sizeof b, ": element %zu is %.9g, the reference %.9g (error %s of the output's RMS > %s)",
                  c.max_at, double(got[c.max_at]), double(ref[c.max_at]), fmt_double(c.max_err).c_str(),
                  fmt_double(c.max_err_limit).c_str());
    c.error = what + b;
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Public API

const char* conformance_status_name(ConformanceStatus s) {
  switch (s) {
    case ConformanceStatus::Pass: return "PASS";
    case ConformanceStatus::Fail: return "FAIL";
    case ConformanceStatus::Skip: return "SKIP";
  }
  return "?";
}

// From the worst a correct backend shows (cpu_avx512, cpu_amx and vulkan on lavapipe,
// every case; docs/conformance.md has the table) with a margin of 5-50x: products on
// the same quantized activations differ from cpu_scalar only by the float order of
// the block scaling and the sum (NMSE <= 2e-11, element <= 4.4e-6 of the RMS); the
// reference's F16 rounding of the attention accumulator makes a one-ulp flip (1e-3
// relative) of an element possible; data movement and single IEEE operations are exact.
// The weight dtype does not change them: every weight format's integer sums are exact.
ConformanceLimits conformance_limits(Op op, DType weight) {
  (void)weight;
  switch (op) {
    case Op::MatMul:
    case Op::MatMulId: return {1e-9, 2e-5};
    case Op::Attention:
    case Op::GeGlu: return {1e-7, 1e-2};  // GeGlu's GELU is rounded to F16, like the attention sum
    case Op::GatedDeltaNet: return {1e-11, 2e-5};
    case Op::RmsNorm:
    case Op::Softmax:
    case Op::Silu:
    case Op::SwiGlu:
    case Op::SwiGluOai:
    case Op::Sigmoid:
    case Op::Softplus:
    case Op::Rope:
    case Op::SsmConv:
    case Op::NormalizeRows:
    case Op::MoeCombine: return {1e-12, 1e-5};
    default: return {0.0, 0.0};  // Add, Mul, Cont, GatherCols, GetRows, KvWrite, Argmax, TopK
  }
}

bool ConformanceFilter::matches(const ConformanceCase& c) const {
  if (!op.empty()) {
    bool any = false;
    for (const std::string& item : split_list(op)) {
      bool is_op = false;
      for (int i = 0; i < int(Op::Count); ++i)
        if (fold(item) == fold(op_label(Op(i)))) is_op = true;
      if (is_op ? fold(item) == fold(c.op) : c.name().find(item) != std::string::npos) any = true;
    }
    if (!any) return false;
  }
  if (!dtype.empty()) {
    bool any = false;
    for (const std::string& item : split_list(dtype))
      if (fold(item) == fold(c.dtype)) any = true;
    if (!any) return false;
  }
  return true;
}

const std::vector<ConformanceCase>& conformance_cases() {
  static const std::vector<ConformanceCase> cases = make_cases();
  return cases;
}

std::vector<ConformanceCase> conformance_cases(const ConformanceFilter& filter) {
  std::vector<ConformanceCase> out;
  for (const auto& c : conformance_cases())
    if (filter.matches(c)) out.push_back(c);
  return out;
}

ConformanceResult run_conformance_case(const ConformanceCase& c, Backend& test, Backend& reference) {
  ConformanceResult res;
  res.c = c;
  res.limit = conformance_limits(c.kind, c.type).nmse;
  res.max_err_limit = conformance_limits(c.kind, c.type).element;
  auto fail = [&](std::string msg) {
    res.status = ConformanceStatus::Fail;
    res.message = std::move(msg);
    return res;
  };

  CaseGraph spec;
  std::unique_ptr<Instance> ref, got;
  try {
    spec = build_case(c);
    ref = instantiate(spec, reference);
  } catch (const std::exception& e) {
    return fail(std::string("could not build the reference graph: ") + e.what());
  }
  try {
    got = instantiate(spec, test);
  } catch (const std::exception& e) {
    return fail("prepare_weight / setup failed on " + test.name() + ": " + e.what());
  }

  // Support: the tested backend may refuse (SKIP with its reason); the reference must not.
  for (const Node& n : ref->graph.nodes()) {
    OpSupport s = reference.supports(ref->graph, n);
    if (!s.supported) return fail("the reference (" + reference.name() + ") refuses the case: " + s.reason);
  }
  for (const Node& n : got->graph.nodes()) {
    OpSupport s = test.supports(got->graph, n);
    if (!s.supported) {
      res.status = ConformanceStatus::Skip;
      res.message = s.reason.empty() ? std::string(op_label(n.op)) + " not supported (no reason given)" : s.reason;
      return res;
    }
  }

  try {
    execute(spec, *ref, reference);
  } catch (const std::exception& e) {
    return fail("the reference (" + reference.name() + ") threw: " + e.what());
  }
  try {
    execute(spec, *got, test);
  } catch (const std::exception& e) {
    return fail(test.name() + " threw: " + e.what());
  } catch (...) {
    return fail(test.name() + " threw an unknown exception");
  }

  std::vector<std::string> errors;
  // Memory safety: guards around every tensor, inputs and weights unchanged.
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& ts = spec.tensors[i];
    std::string g = got->bufs[i]->check(ts.name);
    if (!g.empty()) errors.push_back(g);
    std::string rg = ref->bufs[i]->check(ts.name);
    if (!rg.empty()) errors.push_back("reference: " + rg);
    const auto made = got->made.find(i);
    const uint8_t* want = made != got->made.end() ? made->second.data() : ts.init.data();
    if (ts.role != Role::Output && ts.view_of < 0 && ts.bytes() > 0 && std::memcmp(got->bufs[i]->data(), want, ts.bytes()) != 0)
      errors.push_back(std::string(ts.role == Role::Weight ? "weight" : "input") + " '" + ts.name +
                       "' was modified (a backend must not write its sources)");
  }

  // Outputs.
  double worst_ratio = -1.0;
  auto account = [&](const Compared& cmp) {
    if (!cmp.error.empty()) errors.push_back(cmp.error);
    const double ratio = cmp.limit > 0 ? cmp.nmse / cmp.limit : (cmp.nmse > 0 ? INFINITY : 0.0);
    if (ratio > worst_ratio || worst_ratio < 0) {
      worst_ratio = ratio;
      res.nmse = cmp.nmse;
      res.limit = cmp.limit;
    }
    if (cmp.max_err > res.max_err) res.max_err = cmp.max_err;
    res.max_err_limit = cmp.max_err_limit;
  };
  for (int oi : spec.outputs) {
    const TensorSpec& ts = spec.tensors[size_t(oi)];
    const size_t n = size_t(ts.ne[0] * ts.ne[1] * ts.ne[2] * ts.ne[3]);
    if (ts.type == DType::I32) {
      const auto* a = reinterpret_cast<const int32_t*>(ref->bufs[size_t(oi)]->data());
      const auto* b = reinterpret_cast<const int32_t*>(got->bufs[size_t(oi)]->data());
      size_t bad = 0, first = n;
      for (size_t i = 0; i < n; ++i)
        if (a[i] != b[i]) {
          if (!bad) first = i;
          ++bad;
        }
      Compared cmp;
      cmp.limit = 0.0;
      cmp.nmse = n ? double(bad) / double(n) : 0.0;
      if (bad)
        cmp.error = "'" + ts.name + "': " + std::to_string(bad) + " of " + std::to_string(n) + " ids differ (first at " +
                    std::to_string(first) + ": reference " + std::to_string(a[first]) + ", got " +
                    std::to_string(b[first]) + ")";
      account(cmp);
    } else {
      const auto* a = reinterpret_cast<const float*>(ref->bufs[size_t(oi)]->data());
      const auto* b = reinterpret_cast<const float*>(got->bufs[size_t(oi)]->data());
      Compared cmp = compare_floats(a, b, n, conformance_limits(c.kind, c.type), "'" + ts.name + "'");
      check_limits(cmp, "'" + ts.name + "'", a, b);
      account(cmp);
    }
  }

  // KV cache: the written positions of the tested layer and sequence equal the
  // reference's; everything else (history, the other layer and sequence, reserved
  // positions past the end) is untouched.
  if (spec.kv.used && !spec.kv.seqs.empty()) {
    // Batched: per sequence, the positions the run wrote (tested layer) equal the
    // reference's; every other row holds what setup put there (below a fork point,
    // the parent's values, read through the shared pages).
    KvCache &rk = *ref->kv, &gk = *got->kv;
    const int64_t row = int64_t(rk.row_elems());
    std::vector<uint16_t> gr(static_cast<size_t>(row)), rr(static_cast<size_t>(row));
    std::vector<float> a, b;
    std::string bystander;
    for (size_t i = 0; i < spec.kv.seqs.size(); ++i) {
      const KvSeqSpec& ss = spec.kv.seqs[i];
      const KvCache::SeqId gs = got->seqs[i], rs = ref->seqs[i];
      const std::string seq_name = "sequence " + std::to_string(i) +
                                   (ss.parent >= 0 ? " (a fork of " + std::to_string(ss.parent) + " at " +
                                                         std::to_string(ss.fork_at) + ")"
                                                   : "");
      if (gk.length(gs) != rk.length(rs))
        errors.push_back("KV cache: " + seq_name + " has length " + std::to_string(gk.length(gs)) +
                         " after the run, the reference has " + std::to_string(rk.length(rs)));
      const int64_t end = ss.history + ss.written;
      for (int layer = 0; layer < spec.kv.cfg.n_layers; ++layer)
        for (int64_t pos = 0; pos < ss.capacity; ++pos) {
          const bool written = layer == spec.kv.layer && pos >= ss.history && pos < end;
          const int owner = spec.kv.owner(int(i), pos);
          for (int kvsel = 0; kvsel < kv_planes(rk); ++kvsel) {
            gk.read_row(layer, gs, pos, kvsel, gr.data());
            if (written) {
              rk.read_row(layer, rs, pos, kvsel, rr.data());
              for (int64_t e = 0; e < row; ++e) {
                a.push_back(quant::fp16_to_fp32(rr[e]));
                b.push_back(quant::fp16_to_fp32(gr[e]));
              }
            } else if (bystander.empty()) {
              for (int64_t e = 0; e < row; ++e)
                if (gr[e] != kv_init(owner, layer, pos, kvsel, e)) {
                  bystander = "KV cache: " + std::string(kvsel ? "V" : "K") + " of " + seq_name + ", layer " +
                              std::to_string(layer) + ", position " + std::to_string(pos) +
                              (owner != int(i) ? " (in a page shared with sequence " + std::to_string(owner) + ")" : "") +
                              " was overwritten (the run writes only positions [" + std::to_string(ss.history) + ", " +
                              std::to_string(end) + ") of layer " + std::to_string(spec.kv.layer) + ")";
                  break;
                }
            }
          }
        }
    }
    if (!bystander.empty()) errors.push_back(bystander);
    Compared cmp = compare_floats(a.data(), b.data(), a.size(), conformance_limits(Op::KvWrite, DType::F16), "KV cache contents");
    check_limits(cmp, "KV cache contents", a.data(), b.data());
    account(cmp);
  } else if (spec.kv.used) {
    KvCache &rk = *ref->kv, &gk = *got->kv;
    if (gk.length(got->seq) != rk.length(ref->seq))
      errors.push_back("KV cache: sequence length " + std::to_string(gk.length(got->seq)) + " after the run, the reference has " +
                       std::to_string(rk.length(ref->seq)));
    const int64_t row = int64_t(rk.row_elems());
    const int64_t end = spec.kv.history + spec.kv.written;
    std::vector<uint16_t> gr(static_cast<size_t>(row)), rr(static_cast<size_t>(row));
    std::vector<float> a, b;
    std::string bystander;
    for (KvCache::SeqId s : {got->seq, got->other_seq})
      for (int layer = 0; layer < spec.kv.cfg.n_layers; ++layer)
        for (int64_t pos = 0; pos < spec.kv.capacity; ++pos) {
          const bool written = s == got->seq && layer == spec.kv.layer && pos >= spec.kv.history && pos < end;
          for (int kvsel = 0; kvsel < kv_planes(rk); ++kvsel) {
            gk.read_row(layer, s, pos, kvsel, gr.data());
            if (written) {
              rk.read_row(layer, ref->seq, pos, kvsel, rr.data());
              for (int64_t e = 0; e < row; ++e) {
                a.push_back(quant::fp16_to_fp32(rr[e]));
                b.push_back(quant::fp16_to_fp32(gr[e]));
              }
            } else if (bystander.empty()) {
              for (int64_t e = 0; e < row; ++e)
                if (gr[e] != kv_init(int(s), layer, pos, kvsel, e)) {
                  bystander = "KV cache: " + std::string(kvsel ? "V" : "K") + " of " +
                              (s == got->seq ? "the tested" : "another") + " sequence, layer " + std::to_string(layer) +
                              ", position " + std::to_string(pos) + " was overwritten (only positions [" +
                              std::to_string(spec.kv.history) + ", " + std::to_string(end) + ") of layer " +
                              std::to_string(spec.kv.layer) + " may be written)";
                  break;
                }
            }
          }
        }
    if (!bystander.empty()) errors.push_back(bystander);
    Compared cmp = compare_floats(a.data(), b.data(), a.size(), conformance_limits(Op::KvWrite, DType::F16), "KV cache contents");
    check_limits(cmp, "KV cache contents", a.data(), b.data());
    account(cmp);
  }

  // Recurrent state: the tested slot matches the reference, every other slot (and
  // the state kind the op does not own) is exactly as set up.
  const RecurrentStateConfig& rc = spec.kv.cfg.recurrent;
  if (spec.kv.used && rc.n_layers > 0) {
    KvCache &rk = *ref->kv, &gk = *got->kv;
    std::string bystander;
    for (KvCache::SeqId s : {got->seq, got->other_seq})
      for (int layer = 0; layer < rc.n_layers; ++layer)
        for (int kind = 0; kind < 2; ++kind) {
          const bool tested = s == got->seq && layer == spec.kv.layer && (kind == 0 ? spec.kv.conv : spec.kv.rec);
          const int64_t n = kind == 0 ? rc.conv_elems : rc.state_elems;
          const float* gs = kind == 0 ? gk.conv_state(layer, s) : gk.recurrent_state(layer, s);
          if (tested) {
            const float* rs = kind == 0 ? rk.conv_state(layer, ref->seq) : rk.recurrent_state(layer, ref->seq);
            const std::string what = kind == 0 ? "conv state" : "recurrent state";
            Compared cmp = compare_floats(rs, gs, size_t(n), conformance_limits(c.kind, c.type), what);
            check_limits(cmp, what, rs, gs);
            account(cmp);
          } else if (bystander.empty()) {
            for (int64_t e = 0; e < n; ++e)
              if (gs[e] != rec_init(int(s), layer, kind, e)) {
                bystander = std::string(kind == 0 ? "conv" : "recurrent") + " state of " +
                            (s == got->seq ? "the tested" : "another") + " sequence, recurrent layer " +
                            std::to_string(layer) + " was modified (element " + std::to_string(e) + ")";
                break;
              }
          }
        }
    if (!bystander.empty()) errors.push_back(bystander);
  }

  if (!errors.empty()) {
    std::string msg;
    for (const auto& e : errors) msg += (msg.empty() ? "" : "; ") + e;
    return fail(msg);
  }
  res.status = ConformanceStatus::Pass;
  return res;
}

std::vector<ConformanceResult> run_conformance(Backend& test, Backend& reference, const ConformanceFilter& filter) {
  std::vector<ConformanceResult> out;
  for (const auto& c : conformance_cases())
    if (filter.matches(c)) out.push_back(run_conformance_case(c, test, reference));
  return out;
}

double nmse(const float* ref, const float* got, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(ref[i]) - double(got[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0.0 ? num / den : (num > 0.0 ? std::numeric_limits<double>::infinity() : 0.0);
}

}  // namespace tessera
