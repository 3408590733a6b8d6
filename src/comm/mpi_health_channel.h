// The MPI backend's HealthChannel: two duplicates of the backend's
// communicator (one for the watchdog's point-to-point messages, one for the
// sequence check's collectives, so that neither can match an op of the data
// path), and one watchdog thread per rank that answers other ranks' queries
// with its flight record and collects their failure announcements. It wakes
// every 10 ms; each wake-up is two MPI_Iprobe calls.
#pragma once

#include <mpi.h>

#include <memory>

#include "zero/comm/flight_recorder.h"
#include "zero/comm/health_channel.h"

namespace zero::comm::detail {

// Collective over `parent`. `recorder` must outlive the channel.
std::shared_ptr<HealthChannel> make_mpi_health_channel(MPI_Comm parent, const FlightRecorder& recorder);

}  // namespace zero::comm::detail
