// bench/json.hpp — gin-bench's JSON writer: a tiny tree (objects keep
// insertion order) that rank 0 fills and main writes with --json.
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace bench {

// printf into a std::string (the writer's numbers, and every line gin-bench prints).
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// A tiny JSON tree (objects keep insertion order).
struct J {
  enum class T { Null, Bool, Num, Str, Arr, Obj } t = T::Null;
  bool b = false;
  double n = 0;
  std::string s;
  std::vector<std::string> keys;
  std::vector<J> vals;

  static J num(double v) {
    J j;
    j.t = T::Num;
    j.n = v;
    return j;
  }
  static J str(std::string v) {
    J j;
    j.t = T::Str;
    j.s = std::move(v);
    return j;
  }
  static J boolean(bool v) {
    J j;
    j.t = T::Bool;
    j.b = v;
    return j;
  }
  static J arr() {
    J j;
    j.t = T::Arr;
    return j;
  }
  static J obj() {
    J j;
    j.t = T::Obj;
    return j;
  }
  J& set(std::string k, J v) {
    keys.push_back(std::move(k));
    vals.push_back(std::move(v));
    return *this;
  }
  J& set(std::string k, double v) { return set(std::move(k), num(v)); }
  J& set(std::string k, const char* v) { return set(std::move(k), str(v)); }
  J& set(std::string k, const std::string& v) { return set(std::move(k), str(v)); }
  J& push(J v) {
    vals.push_back(std::move(v));
    return *this;
  }

  static void quote(std::string& o, const std::string& v) {
    o += '"';
    for (unsigned char ch : v) {
      if (ch == '"' || ch == '\\') {
        o += '\\';
        o += char(ch);
      } else if (ch == '\n')
        o += "\\n";
      else if (ch < 0x20)
        o += fmt("\\u%04x", ch);
      else
        o += char(ch);
    }
    o += '"';
  }
  void write(std::string& o, int ind) const {
    const std::string pad(size_t(ind + 2), ' '), end(size_t(ind), ' ');
    switch (t) {
      case T::Null: o += "null"; break;
      case T::Bool: o += b ? "true" : "false"; break;
      case T::Num:
        if (!std::isfinite(n))
          o += "null";
        else if (n == std::floor(n) && std::fabs(n) < 9e15)
          o += fmt("%.0f", n);
        else
          o += fmt("%.6g", n);
        break;
      case T::Str: quote(o, s); break;
      case T::Arr:
      case T::Obj: {
        const bool isObj = t == T::Obj;
        o += isObj ? "{" : "[";
        for (size_t i = 0; i < vals.size(); ++i) {
          o += i ? ",\n" : "\n";
          o += pad;
          if (isObj) {
            quote(o, keys[i]);
            o += ": ";
          }
          vals[i].write(o, ind + 2);
        }
        if (!vals.empty()) {
          o += "\n";
          o += end;
        }
        o += isObj ? "}" : "]";
        break;
      }
    }
  }
};

}  // namespace bench
