#include "distributed/step_message.h"

#include <cstring>
#include <string>

#include "tessera/error.h"

namespace tessera::detail {

namespace {

constexpr uint32_t kMagic = 0x54535450;  // "TSTP"

struct Writer {
  std::vector<uint8_t> out;
  template <class T>
  void put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void ids(const std::vector<int32_t>& v) {
    put(uint32_t(v.size()));
    const size_t at = out.size();
    out.resize(at + v.size() * sizeof(int32_t));
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(int32_t));
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  template <class T>
  T get() {
    if (in.size() - at < sizeof(T)) throw Error("distributed run: a step message is truncated");
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::vector<int32_t> ids() {
    const uint32_t n = get<uint32_t>();
    if ((in.size() - at) / sizeof(int32_t) < n) throw Error("distributed run: a step message is truncated");
    std::vector<int32_t> v(n);
    if (n) std::memcpy(v.data(), in.data() + at, size_t(n) * sizeof(int32_t));
    at += size_t(n) * sizeof(int32_t);
    return v;
  }
};

}  // namespace

std::vector<uint8_t> encode(const StepMessage& m) {
  Writer w;
  w.put(kMagic);
  w.put(uint8_t(m.quit));
  w.put(uint32_t(m.calls.size()));
  for (const KvCache::Call& c : m.calls) {
    w.put(uint8_t(c.kind));
    w.put(int32_t(c.seq));
    w.put(int64_t(c.n));
    w.put(uint64_t(c.key));
    w.put(int64_t(c.result));
    w.ids(c.ids);
  }
  w.put(uint32_t(m.chunks.size()));
  for (const StepChunk& c : m.chunks) {
    w.put(int32_t(c.seq));
    w.ids(c.tokens);
  }
  return std::move(w.out);
}

StepMessage decode(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  if (r.get<uint32_t>() != kMagic) throw Error("distributed run: a step message has the wrong magic");
  StepMessage m;
  m.quit = r.get<uint8_t>() != 0;
  const uint32_t calls = r.get<uint32_t>();
  for (uint32_t i = 0; i < calls; ++i) {
    KvCache::Call c;
    const uint8_t kind = r.get<uint8_t>();
    if (kind > uint8_t(KvCache::Call::Kind::ClearPrefix)) throw Error("distributed run: unknown KV call " + std::to_string(kind));
    c.kind = KvCache::Call::Kind(kind);
    c.seq = r.get<int32_t>();
    c.n = r.get<int64_t>();
    c.key = r.get<uint64_t>();
    c.result = r.get<int64_t>();
    c.ids = r.ids();
    m.calls.push_back(std::move(c));
  }
  const uint32_t chunks = r.get<uint32_t>();
  for (uint32_t i = 0; i < chunks; ++i) {
    StepChunk c;
    c.seq = r.get<int32_t>();
    c.tokens = r.ids();
    m.chunks.push_back(std::move(c));
  }
  if (r.at != bytes.size()) throw Error("distributed run: a step message has trailing bytes");
  return m;
}

}  // namespace tessera::detail
