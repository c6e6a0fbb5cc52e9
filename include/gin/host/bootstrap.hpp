// gin/host/bootstrap.hpp — how the ranks of a job find each other before there is a communicator.
//
// Building a communicator needs a few small host collectives over a side channel
// (memory handles, queue-pair numbers, topology): allGather, broadcast, barrier.
// InProcessGroup runs N threads of one process as N ranks (tests, CPU emulation);
// TcpBootstrap runs ranks as processes on any hosts, meeting at rank 0 (a star),
// which is found through a UniqueId or through the launcher's environment
// (torchrun, Slurm, Open MPI; see detectLaunch()). This is slow-path code: it
// favours simple, checked framing and failures that name the rank, the address
// and what to do, and every wait has a deadline so a lost rank never hangs a job.
//
// This header includes all of it; the pieces, one job each:
//   bootstrap_base.hpp       the abstract Bootstrap, BootstrapConfig, shared helpers
//   bootstrap_inprocess.hpp  InProcessGroup / InProcessBootstrap
//   bootstrap_tcp.hpp        TcpBootstrap (frames: bootstrap_frame.hpp; one host: bootstrap_shm.hpp)
//   unique_id.hpp            UniqueId, makeUniqueId()
//   launch.hpp               LaunchInfo, detectLaunch()
//   socket.hpp, deadline.hpp, env.hpp  sockets, deadlines, environment variables
#pragma once

#include "gin/host/bootstrap_base.hpp"
#include "gin/host/bootstrap_inprocess.hpp"
#include "gin/host/bootstrap_tcp.hpp"
#include "gin/host/deadline.hpp"
#include "gin/host/env.hpp"
#include "gin/host/launch.hpp"
#include "gin/host/socket.hpp"
#include "gin/host/unique_id.hpp"
