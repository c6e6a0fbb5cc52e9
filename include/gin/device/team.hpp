// gin/device/team.hpp — teams (world, lsa, rail) and rank translation.
//
// A team is an arithmetic set of world ranks: member i is world rank
// base + i*stride, and `rank` is this rank's index. Peers are always named by
// their index in a team; Net and the barriers translate to world ranks.
#pragma once

#include "gin/device/comm.hpp"

namespace gin {

struct Team {
  int32_t nRanks, rank, stride;
};

// Every rank.
GIN_HD GIN_INLINE Team teamWorld(const DevComm& c) { return Team{c.nRanks, c.rank, 1}; }
// Ranks this one reaches by load/store (normally its node).
GIN_HD GIN_INLINE Team teamLsa(const DevComm& c) { return Team{c.lsaSize, c.lsaRank, 1}; }
// The ranks with this rank's local index on every node.
GIN_HD GIN_INLINE Team teamRail(const DevComm& c) { return Team{c.railSize, c.railRank, c.lsaSize}; }

// Team index -> world rank.
GIN_HD GIN_INLINE int teamToWorld(const DevComm& c, Team t, int peer) { return c.rank + (peer - t.rank) * t.stride; }
// World rank -> index in `t`, or -1 if that rank is not a member.
GIN_HD GIN_INLINE int worldToTeam(const DevComm& c, Team t, int worldRank) {
  const int d = worldRank - c.rank;
  if (d % t.stride != 0) return -1;
  const int i = t.rank + d / t.stride;
  return (i >= 0 && i < t.nRanks) ? i : -1;
}
// Team index -> index in the lsa team, or -1 if not load/store reachable.
GIN_HD GIN_INLINE int teamToLsa(const DevComm& c, Team t, int peer) { return lsaIndexOf(c, teamToWorld(c, t, peer)); }

}  // namespace gin
