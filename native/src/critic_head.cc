// The critic's value head file (see critic_head.h).
#include "critic_head.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace ooze {

namespace {

// value_head.bin: magic, u32 format, u64 count (H + 1), params, i64 step, m, v (little-endian f32).
constexpr char kHeadMagic[8] = {'O', 'O', 'Z', 'E', 'V', 'H', 'E', 'D'};

}  // namespace

void save_head(const CriticHead& h, const std::string& path) {
  if (!h.present()) throw std::runtime_error("saveValueHead: the trainer has no value head");
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write the value head to " + tmp);
    const uint32_t format = 1;
    const uint64_t n = h.params.size();
    const int64_t step = h.opt.step;
    std::vector<float> zeros(n, 0.0f);
    const auto& m = h.opt.m.size() == n ? h.opt.m : zeros;
    const auto& v = h.opt.v.size() == n ? h.opt.v : zeros;
    f.write(kHeadMagic, 8), f.write(reinterpret_cast<const char*>(&format), 4), f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(reinterpret_cast<const char*>(h.params.data()), static_cast<std::streamsize>(n * 4));
    f.write(reinterpret_cast<const char*>(&step), 8);
    f.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(n * 4));
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * 4));
    if (!f) throw std::runtime_error("writing the value head to " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

void load_head(CriticHead& h, int hidden, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read the value head file " + path);
  char magic[8];
  uint32_t format = 0;
  uint64_t n = 0;
  f.read(magic, 8), f.read(reinterpret_cast<char*>(&format), 4), f.read(reinterpret_cast<char*>(&n), 8);
  if (!f || std::memcmp(magic, kHeadMagic, 8) != 0 || format != 1)
    throw std::runtime_error(path + " is not an ooze value head file (magic OOZEVHED, format 1)");
  if (n != static_cast<uint64_t>(hidden) + 1)
    throw std::runtime_error(path + " holds a value head of " + std::to_string(n) + " floats; this model needs " + std::to_string(hidden + 1) + " (hidden_size + 1)");
  CriticHead out;
  out.reset(hidden);
  out.opt.m.assign(n, 0.0f), out.opt.v.assign(n, 0.0f);
  f.read(reinterpret_cast<char*>(out.params.data()), static_cast<std::streamsize>(n * 4));
  f.read(reinterpret_cast<char*>(&out.opt.step), 8);
  f.read(reinterpret_cast<char*>(out.opt.m.data()), static_cast<std::streamsize>(n * 4));
  f.read(reinterpret_cast<char*>(out.opt.v.data()), static_cast<std::streamsize>(n * 4));
  if (!f) throw std::runtime_error(path + " is truncated");
  h = std::move(out);
}

}  // namespace ooze
