// gin/host/agree.hpp — collective checks: every rank states a verdict (and a
// size), every rank learns all of them, and the first rank with a problem is
// named on every rank. This is how a bad argument on one rank becomes a
// gin::Error on all ranks instead of a hang. Each call is a bootstrap
// allGather: every rank calls the same ones in the same order.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/bootstrap.hpp"

namespace gin::detail {

struct Vote {
  uint64_t bytes;
  char problem[240];
};

// Every rank's vote; throws on every rank if any rank has a problem.
inline std::vector<Vote> vote(Bootstrap& bs, const char* what, uint64_t bytes, const char* localProblem) {
  const int nRanks = bs.nRanks(), rank = bs.rank();
  std::vector<Vote> votes(static_cast<size_t>(nRanks));
  Vote& v = votes[size_t(rank)];
  v.bytes = bytes;
  std::snprintf(v.problem, sizeof v.problem, "%s", localProblem ? localProblem : "");
  bs.allGather(votes.data(), sizeof(Vote));
  for (int r = 0; r < nRanks; ++r)
    if (votes[size_t(r)].problem[0])
      throw Error(std::string(what) + ": on rank " + std::to_string(r) + ", " + votes[size_t(r)].problem);
  return votes;
}

// Every rank runs `step` (a local check or setup); if it threw a gin::Error
// on any rank, every rank throws with that rank's message.
template <class Step>
void agreeOn(Bootstrap& bs, const char* what, Step&& step) {
  std::string problem;
  try {
    step();
  } catch (const Error& e) {
    problem = e.what();
  }
  (void)vote(bs, what, 0, problem.empty() ? nullptr : problem.c_str());
}

// Every rank's verdict and one value every rank must pass alike (`name`,
// in `unit`s): a problem on any rank, or ranks that differ, throws on every
// rank, naming them and saying what to do (`fix`).
inline void agreeOnValue(Bootstrap& bs, const char* what, uint64_t value, const char* name, const char* unit,
                         const char* localProblem, const char* fix) {
  const std::vector<Vote> votes = vote(bs, what, value, localProblem);
  for (size_t r = 1; r < votes.size(); ++r)
    if (votes[r].bytes != votes[0].bytes)
      throw Error(std::string(what) + ": ranks disagree on " + name + ": rank 0 passed " +
                  std::to_string(votes[0].bytes) + unit + ", rank " + std::to_string(r) + " passed " +
                  std::to_string(votes[r].bytes) + unit + "; " + fix);
}

// Argument check of a window call: every rank learns every rank's size and verdict.
inline void agreeOnSize(Bootstrap& bs, const char* what, size_t bytes, const char* localProblem) {
  agreeOnValue(bs, what, bytes, "the window size", " bytes", localProblem, "every rank must pass the same size");
}

}  // namespace gin::detail
