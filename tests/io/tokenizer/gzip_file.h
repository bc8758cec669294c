#pragma once
// Reads a committed gzip fixture into memory (tests, bench/tokenizer_bench.cc and
// fuzz/tokenizer_fuzz.cc share it).
#include <zlib.h>

#include <stdexcept>
#include <string>

namespace metrale::testing {

inline std::string read_gzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error(path + ": cannot open");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  const bool ok = n == 0;
  gzclose(f);
  if (!ok) throw std::runtime_error(path + ": gzip read error");
  return out;
}

}  // namespace metrale::testing
