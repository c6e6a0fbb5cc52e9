// gin/host/env.hpp: the table of GIN_* variables, the readers, the number
// parser, GIN_DEBUG's block; and that docs/configuration.md and every
// "GIN_..." string in include/ agree with the table.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../common/ranks.hpp"
#include "gin/host/env.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gintest::EnvVar;

namespace {

#ifndef GIN_TEST_SOURCE_ROOT
#error "tests/meson.build defines GIN_TEST_SOURCE_ROOT"
#endif
const std::filesystem::path kRoot = GIN_TEST_SOURCE_ROOT;

std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What `f` throws, as text ("" when it does not throw).
std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string captureStderr(const std::function<void()>& f) {
  std::fflush(stderr);
  char path[] = "/tmp/gin-env-stderr-XXXXXX";
  const int fd = mkstemp(path);
  const int saved = dup(2);
  dup2(fd, 2);
  std::exception_ptr err;
  try {
    f();
  } catch (...) {
    err = std::current_exception();
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::string out = readFile(path);
  unlink(path);
  if (err) std::rethrow_exception(err);
  return out;
}

}  // namespace

TEST_CASE("env: sizes take K/M/G suffixes (powers of 1024) within the row's range", "[env]") {
  const char* n = "GIN_ALLREDUCE_RING_CHUNK_SIZE";  // 1 .. 16M
  const struct {
    const char* text;
    long long value;
  } good[] = {{"1", 1}, {"64K", 64 << 10}, {"64k", 64 << 10}, {"64KiB", 64 << 10}, {"64KB", 64 << 10},
              {"2M", 2 << 20}, {"2MiB", 2 << 20}, {"16M", 16 << 20}, {"512B", 512}};
  for (const auto& g : good) {
    CAPTURE(g.text);
    EnvVar e(n, g.text);
    CHECK(env::size(n) == g.value);
  }
  {
    EnvVar e("GIN_ALLREDUCE_RING_MAX_BDP", "4G");
    CHECK(env::size("GIN_ALLREDUCE_RING_MAX_BDP") == 4ll << 30);
  }
  {
    EnvVar e("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE", "-1");  // the one negative allowed: always
    CHECK(env::size("GIN_ALLREDUCE_RING_BIDIR_AG_MAX_SIZE") == -1);
  }
  for (const char* bad : {"0", "17M", "1G", "-1", "1T", "1.5M", " 1K", "1K ", "+1", "0x10", "K", "1KK", "-",
                          "99999999999999999999", "9999999999G"}) {
    CAPTURE(bad);
    EnvVar e(n, bad);
    const std::string msg = errorOf([&] { (void)env::size(n); });
    CHECK_THAT(msg, ContainsSubstring(std::string("GIN_ALLREDUCE_RING_CHUNK_SIZE=\"") + bad + "\" is not allowed") &&
                        ContainsSubstring("expected bytes from 1 to 16M (suffixes K, M, G: powers of 1024)"));
  }
}

TEST_CASE("env: integers are plain decimal within the row's range (and step)", "[env]") {
  {
    EnvVar e("GIN_PROXY_THREADS", "3");
    CHECK(env::integer("GIN_PROXY_THREADS") == 3);
  }
  for (const char* bad : {"0", "4097", "1K", "-1", "2x", " 2", "1.5", "+3", "abc"}) {
    CAPTURE(bad);
    EnvVar e("GIN_PROXY_THREADS", bad);
    CHECK_THAT(errorOf([] { (void)env::integer("GIN_PROXY_THREADS"); }),
               ContainsSubstring(std::string("gin: GIN_PROXY_THREADS=\"") + bad + "\" is not allowed") &&
                   ContainsSubstring("expected an integer from 1 to 4096") &&
                   ContainsSubstring("proxy engine threads per communicator"));
  }
  {
    EnvVar e("GIN_ALLREDUCE_RING_BLOCK_SIZE", "96");
    CHECK(env::integer("GIN_ALLREDUCE_RING_BLOCK_SIZE") == 96);
  }
  {
    EnvVar e("GIN_ALLREDUCE_RING_BLOCK_SIZE", "100");
    CHECK_THAT(errorOf([] { (void)env::integer("GIN_ALLREDUCE_RING_BLOCK_SIZE"); }),
               ContainsSubstring("an integer from 32 to 512, a multiple of 32"));
  }
  {
    EnvVar e("GIN_TIMEOUT_MS", "31536000001");  // past a year
    CHECK_THAT(errorOf([] { (void)env::integer("GIN_TIMEOUT_MS"); }), ContainsSubstring("GIN_TIMEOUT_MS="));
  }
  // Launcher variables: the same parser with the caller's range, no row.
  {
    EnvVar e("MASTER_PORT", "80x");
    CHECK_THAT(errorOf([] { (void)env::integer("MASTER_PORT", 1, 65535); }),
               ContainsSubstring("MASTER_PORT=\"80x\" is not allowed: expected an integer from 1 to 65535"));
  }
  {
    EnvVar e("LOCAL_RANK", "7");
    CHECK(env::integer("LOCAL_RANK", 0, 100) == 7);
  }
}

TEST_CASE("env: set but empty counts as unset, for every kind", "[env]") {
  for (const env::Var& v : env::kVars) {
    CAPTURE(v.name);
    EnvVar e(v.name, "");
    CHECK_FALSE(env::raw(v.name).has_value());
    switch (v.kind) {
      case env::Kind::Integer: CHECK_FALSE(env::integer(v.name).has_value()); break;
      case env::Kind::Size: CHECK_FALSE(env::size(v.name).has_value()); break;
      case env::Kind::Flag: CHECK_FALSE(env::flag(v.name).has_value()); break;
      case env::Kind::Choice: CHECK_FALSE(env::choice(v.name).has_value()); break;
      case env::Kind::Text:
      case env::Kind::List: CHECK_FALSE(env::text(v.name).has_value()); break;
    }
  }
  EnvVar e("GIN_TIMEOUT_MS", nullptr);
  CHECK_FALSE(env::integer("GIN_TIMEOUT_MS").has_value());
}

TEST_CASE("env: flags are 0 or 1; choices one of their words", "[env]") {
  {
    EnvVar e("GIN_DEBUG", "1");
    CHECK(env::flag("GIN_DEBUG") == true);
  }
  {
    EnvVar e("GIN_DEBUG", "0");
    CHECK(env::flag("GIN_DEBUG") == false);
  }
  for (const char* bad : {"yes", "true", "2", " 1", "on"}) {
    CAPTURE(bad);
    EnvVar e("GIN_SOFT_NIC_DEFERRED_COPIES", bad);
    CHECK_THAT(errorOf([] { (void)env::flag("GIN_SOFT_NIC_DEFERRED_COPIES"); }),
               ContainsSubstring(std::string("GIN_SOFT_NIC_DEFERRED_COPIES=\"") + bad +
                                 "\" is not allowed: expected 0 or 1"));
  }
  for (const char* good : {"auto", "lsa", "proxy", "ibgda"}) {
    EnvVar e("GIN_TRANSPORT", good);
    CHECK(env::choice("GIN_TRANSPORT") == good);
  }
  for (const char* bad : {"LSA", "prox", "proxy ", "lsa,proxy"}) {
    CAPTURE(bad);
    EnvVar e("GIN_TRANSPORT", bad);
    CHECK_THAT(errorOf([] { (void)env::choice("GIN_TRANSPORT"); }),
               ContainsSubstring(std::string("GIN_TRANSPORT=\"") + bad +
                                 "\" is not allowed: expected one of auto, lsa, proxy, ibgda"));
  }
  {
    EnvVar e("GIN_DEVICE", "gpu");
    CHECK_THAT(errorOf([] { (void)env::choice("GIN_DEVICE"); }), ContainsSubstring("expected one of auto, cpu"));
  }
}

TEST_CASE("env: a GIN_* name without a row, or read as another kind, is an error", "[env]") {
  CHECK_THAT(errorOf([] { (void)env::raw("GIN_NO_SUCH_VARIABLE"); }),
             ContainsSubstring("GIN_NO_SUCH_VARIABLE is read but has no row"));
  CHECK_THAT(errorOf([] { (void)env::flag("GIN_TRANSPORT"); }),
             ContainsSubstring("GIN_TRANSPORT is read as a flag but its row says choice"));
  CHECK_THAT(errorOf([] { (void)env::integer("GIN_RANK", 0, 5); }), ContainsSubstring("range its row does not give"));
  CHECK_THAT(errorOf([] { (void)env::integer("MASTER_PORT"); }), ContainsSubstring("needs a GIN_* row"));
}

TEST_CASE("env: every row is well formed", "[env]") {
  std::set<std::string> names;
  for (const env::Var& v : env::kVars) {
    CAPTURE(v.name);
    CHECK(std::string(v.name).rfind("GIN_", 0) == 0);
    CHECK(names.insert(v.name).second);
    CHECK(*v.def != '\0');
    CHECK(*v.meaning != '\0');
    if (v.kind == env::Kind::Integer || v.kind == env::Kind::Size) CHECK(v.lo <= v.hi);
    if (v.kind == env::Kind::Choice || v.kind == env::Kind::Text || v.kind == env::Kind::List)
      CHECK(*v.values != '\0');
    // Markdown table cells.
    CHECK(std::string(v.meaning).find('|') == std::string::npos);
    CHECK(env::allowed(v).find('|') == std::string::npos);
    CHECK(std::string(v.def).find('|') == std::string::npos);
  }
}

TEST_CASE("env: GIN_DEBUG's block lists what is set and the defaults of the rest", "[env][debug]") {
  EnvVar t("GIN_TRANSPORT", "proxy");
  EnvVar b("GIN_ALLREDUCE_RING_CHUNK_SIZE", "64K");
  EnvVar empty("GIN_PROXY_WIRE", "");
  const std::string s = env::describe("gin: rank 0 ");
  CHECK_THAT(s, ContainsSubstring("gin: rank 0 environment: "));
  CHECK_THAT(s, ContainsSubstring("set: ") && ContainsSubstring("GIN_TRANSPORT=proxy") &&
                    ContainsSubstring("GIN_ALLREDUCE_RING_CHUNK_SIZE=64K"));
  CHECK_THAT(s, ContainsSubstring("defaults:") && ContainsSubstring("GIN_PROXY_WIRE=CommConfig::proxy.wire (auto);") &&
                    ContainsSubstring("GIN_ALLREDUCE_RING_MAX_BDP=32M;"));
  // Every line carries the prefix; no line runs far past 120 columns.
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) {
    CAPTURE(line);
    CHECK(line.rfind("gin: rank 0 ", 0) == 0);
    CHECK(line.size() < 200);
  }
  // Each variable once: set or default.
  for (const env::Var& v : env::kVars) {
    CAPTURE(v.name);
    const std::string key = std::string(v.name) + "=";
    const size_t at = s.find(key);
    CHECK(at != std::string::npos);
    CHECK(s.find(key, at + 1) == std::string::npos);
  }
}

TEST_CASE("env: GIN_DEBUG=1 prints the environment, the config and the transport per peer at Comm creation",
          "[env][debug]") {
  const std::string out = captureStderr([] {
    EnvVar dbg("GIN_DEBUG", "1");
    EnvVar tr("GIN_TRANSPORT", "proxy");
    gintest::runRanks(2, [](Comm&) {});
  });
  CHECK_THAT(out, ContainsSubstring("gin: rank 0 environment:") && ContainsSubstring("GIN_DEBUG=1") &&
                      ContainsSubstring("GIN_TRANSPORT=proxy") && ContainsSubstring("defaults:"));
  CHECK_THAT(out, ContainsSubstring("gin: rank 0 CommConfig: nContexts=") && ContainsSubstring("transport=proxy"));
  CHECK_THAT(out, ContainsSubstring("gin: rank 0 transport table (2 ranks): 0=proxy 1=proxy") &&
                      ContainsSubstring("proxy wires: 0=local 1=local"));
  // Once per communicator, from rank 0 only.
  CHECK(out.find("environment:") == out.rfind("environment:"));
  const std::string quiet = captureStderr([] {
    EnvVar dbg("GIN_DEBUG", "0");
    gintest::runRanks(2, [](Comm&) {});
  });
  CHECK(quiet.find("environment:") == std::string::npos);
}

TEST_CASE("env: docs/configuration.md's table is the header's table", "[env][docs]") {
  const std::string doc = readFile(kRoot / "docs" / "configuration.md");
  REQUIRE_FALSE(doc.empty());
  const std::string want = env::markdownTable();
  // The table's rows in the docs, in order, exactly as the header renders them.
  std::string have;
  std::istringstream in(doc);
  bool inTable = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| variable |", 0) == 0) inTable = true;
    if (inTable && line.rfind("|", 0) != 0) break;
    if (inTable) have += line + "\n";
  }
  INFO("docs/configuration.md's table should read:\n" << want);
  CHECK(have == want);
}

TEST_CASE("env: every \"GIN_...\" string in include/ names a row, and every row is read there", "[env][docs]") {
  std::set<std::string> macros, used;
  const std::regex str(R"re("(?:[^"\\\n]|\\.)*")re"), name(R"(GIN_[A-Z0-9_]+)"),
      macro(R"(#\s*(?:if|ifdef|ifndef|define|elif)\b.*)");
  // Build switches (#if GIN_WITH_CUDA, -DGIN_IBGDA_MLX5=1) are macros, not variables.
  std::vector<std::string> lines;  // outside env.hpp, whose table names them all
  for (const auto& f : std::filesystem::recursive_directory_iterator(kRoot / "include" / "gin")) {
    if (!f.is_regular_file() || f.path().extension() != ".hpp") continue;
    std::istringstream in(readFile(f.path()));
    for (std::string line; std::getline(in, line);) {
      if (std::regex_search(line, macro))
        for (std::sregex_iterator n(line.begin(), line.end(), name), e; n != e; ++n) macros.insert(n->str());
      if (f.path().filename() != "env.hpp") lines.push_back(line);
    }
  }
  for (const std::string& line : lines)
    for (std::sregex_iterator m(line.begin(), line.end(), str), e; m != e; ++m) {
      const std::string lit = m->str();
      for (std::sregex_iterator n(lit.begin(), lit.end(), name); n != e; ++n)
        if (env::find(n->str()) || !macros.count(n->str())) used.insert(n->str());  // GIN_DEVICE is both
    }
  for (const std::string& n : used) {
    CAPTURE(n);
    CHECK(env::find(n) != nullptr);
  }
  for (const env::Var& v : env::kVars) {
    CAPTURE(v.name);
    CHECK(used.count(v.name) == 1);
  }
  // The raw read stays in env.hpp.
  for (const auto& f : std::filesystem::recursive_directory_iterator(kRoot / "include" / "gin")) {
    if (!f.is_regular_file() || f.path().filename() == "env.hpp") continue;
    CAPTURE(f.path().string());
    CHECK(readFile(f.path()).find("getenv") == std::string::npos);
  }
}
