// gin/device.hpp — everything a kernel (or a CPU rank emulating one) includes.
#pragma once

#include "gin/core/atomic.hpp"
#include "gin/core/coop.hpp"
#include "gin/core/rolling.hpp"
#include "gin/device/action.hpp"
#include "gin/device/allreduce.hpp"
#include "gin/device/barrier.hpp"
#include "gin/device/batch.hpp"
#include "gin/device/comm.hpp"
#include "gin/device/ll.hpp"
#include "gin/device/net.hpp"
#include "gin/device/p2p.hpp"
#include "gin/device/team.hpp"
#include "gin/device/window.hpp"
