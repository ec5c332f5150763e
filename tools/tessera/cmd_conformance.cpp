// tessera conformance: run the conformance suite (tessera/conformance.h) on backends
// found through the plugin registry, each against a fresh cpu_scalar instance.
//
// Which backends: --backend NAME[,NAME...] if given; otherwise every usable backend
// other than cpu_scalar. If cpu_scalar is the only backend, it is checked against a
// second instance of itself: that only shows the suite and the oracle are sane and
// deterministic (every NMSE must be 0), it proves nothing about another backend.
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "tessera/backend.h"
#include "tessera/conformance.h"
#include "tessera/error.h"
#include "tessera/fast_pool.h"
#include "tessera/model_file.h"

namespace tessera::cli {

namespace {

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

std::string pad(std::string s, size_t w) {
  if (s.size() < w) s += std::string(w - s.size(), ' ');
  return s;
}

}  // namespace

int cmd_conformance(int argc, char** argv) {
  CommonOptions o;
  std::string backends, filter, dtypes;
  int threads = 0;
  bool quiet = false;
  po::options_description desc("options");
  desc.add_options()
    ("backend", po::value(&backends), "backend(s) to test, comma-separated (default: every usable backend "
                                      "other than cpu_scalar; cpu_scalar against itself if it is the only one)")
    ("filter", po::value(&filter), "op name(s), comma-separated (MatMul, mat_mul, Attention ...), or text that "
                                   "must occur in the case name (e.g. K256_N7)")
    ("dtype", po::value(&dtypes), "weight dtype(s), comma-separated (F32, Q4_K ...)")
    ("threads,t", po::value(&threads)->default_value(0), "worker threads including the caller (0 = all cores)")
    ("quiet,q", po::bool_switch(&quiet), "print only failed and skipped cases and the summary");
  add_common_options(desc, o, false);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: tessera conformance [--backend NAME] [--filter OP] [--dtype T] [--plugins FILE]\n\n"
             "Runs every op x dtype x shape case on each backend and on a fresh cpu_scalar instance and compares\n"
             "the outputs (NMSE limits, identical Argmax, guard bytes, NaN/Inf). Exits 1 if any case fails.",
             desc, nullptr, vm))
    return 0;
  if (threads < 0) throw Error("--threads must be >= 0");

  auto reg = make_registry(o);
  const PluginRecord* ref = reg->reference_backend();
  if (!ref) throw Error("no reference backend is available (cpu_scalar; see `tessera backends`)");
  const std::string reference_name = ref->name;
  std::vector<std::string> names;
  bool self_check = false;
  if (!backends.empty()) {
    names = split(backends, ',');
  } else {
    for (const auto& n : reg->ranked_backends())
      if (n != reference_name) names.push_back(n);
    if (names.empty()) {
      names.push_back(reference_name);
      self_check = true;
    }
  }

  ConformanceFilter f{filter, dtypes};
  if (conformance_cases(f).empty()) throw Error("no conformance case matches --filter '" + filter + "' --dtype '" + dtypes + "'");

  FastPool pool(threads);
  auto reference = reg->create_backend(reference_name, &pool);
  if (self_check)
    std::cout << "note: no backend other than " << reference_name << " is usable; checking it against a second "
                 "instance of itself (a sanity check of the suite: every NMSE must be 0)\n";

  int total_pass = 0, total_fail = 0, total_skip = 0;
  for (const std::string& name : names) {
    auto be = reg->create_backend(name, &pool);
    std::cout << "\n== " << name << " against " << reference_name << " ==\n";
    if (const PluginRecord* rec = reg->find(name); rec && !rec->reason.empty())
      std::cout << "probe: " << printable(rec->reason, 300) << "\n";  // e.g. which device, or "emulated"
    std::cout << pad("op", 14) << pad("dtype", 7) << pad("shape", 44) << pad("result", 7) << pad("NMSE", 10)
              << pad("limit", 10) << pad("max err", 10) << pad("limit", 10) << "\n";
    int pass = 0, fail = 0, skip = 0;
    for (const ConformanceCase& c : conformance_cases(f)) {
      ConformanceResult r = run_conformance_case(c, *be, *reference);
      switch (r.status) {
        case ConformanceStatus::Pass: ++pass; break;
        case ConformanceStatus::Fail: ++fail; break;
        case ConformanceStatus::Skip: ++skip; break;
      }
      if (self_check && r.status == ConformanceStatus::Pass && r.nmse != 0.0) {
        r.status = ConformanceStatus::Fail;
        r.message = "cpu_scalar against itself must be bit-identical";
        --pass, ++fail;
      }
      if (quiet && r.status == ConformanceStatus::Pass) continue;
      const bool ran = r.status != ConformanceStatus::Skip;
      std::cout << pad(c.op, 14) << pad(c.dtype, 7) << pad(c.shape, 44) << pad(conformance_status_name(r.status), 7)
                << pad(ran ? fmt(r.nmse) : "-", 10) << pad(r.limit > 0 ? fmt(r.limit) : "exact", 10)
                << pad(ran ? fmt(r.max_err) : "-", 10) << pad(r.max_err_limit > 0 ? fmt(r.max_err_limit) : "exact", 10);
      if (!r.message.empty()) std::cout << r.message;
      std::cout << "\n" << std::flush;
    }
    std::cout << name << ": " << (pass + fail + skip) << " cases, " << pass << " pass, " << fail << " fail, " << skip
              << " skip\n";
    if (pass == 0 && fail == 0) {  // declining everything verifies nothing: not a pass
      std::cout << name << ": 0 cases verified (it declined every case)\n";
      ++fail;
    }
    total_pass += pass, total_fail += fail, total_skip += skip;
  }
  std::cout << "\nconformance: " << names.size() << " backend(s), " << (total_pass + total_fail + total_skip)
            << " cases, " << total_pass << " pass, " << total_fail << " fail, " << total_skip << " skip -> "
            << (total_fail ? "FAIL" : "OK") << "\n";
  return total_fail ? 1 : 0;
}

}  // namespace tessera::cli
