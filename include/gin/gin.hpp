// gin/gin.hpp — the whole library: the device API and the host bootstrap.
#pragma once

#include "gin/device.hpp"
#include "gin/host/allreduce.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/comm.hpp"
#include "gin/host/p2p.hpp"
