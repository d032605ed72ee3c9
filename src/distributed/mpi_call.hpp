// Private to src/distributed: MPI calls whose failures become Error(MpiError), and the agreement
// step that every collective entry point runs before it moves data.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grouplin/error.hpp"

namespace grouplin::distributed {

// Throws Error(MpiError) naming `call` and MPI's own text for `rc` unless it is MPI_SUCCESS.
void check_mpi(int rc, const char* call);

int comm_rank(MPI_Comm comm);
int comm_size(MPI_Comm comm);

// Throws on every rank the lowest failing rank's Error ("rank R of P: " + its message) when any
// rank passes a failure; returns when none does. Collective (one MPI_Allreduce, then, on failure,
// broadcasts of the error).
void raise_agreed(MPI_Comm comm, const std::optional<Error>& failure);

// Each rank's `header` (the same length on every rank), gathered to every rank, after agreeing on
// `failure` as raise_agreed does: one MPI_Allgather in the common case. Row r of the result is
// rank r's header.
std::vector<std::vector<int64_t>> gather_agreed(MPI_Comm comm, const std::optional<Error>& failure,
                                                const std::vector<int64_t>& header);

// Runs `check`, returning what it threw as an Error (other exceptions wrapped as InvalidArgument
// with their text), or nothing.
template <class F>
std::optional<Error> failure_of(const F& check) {
  try {
    check();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(ErrorCode::InvalidArgument, std::string("unexpected failure: ") + e.what());
  }
  return std::nullopt;
}

}  // namespace grouplin::distributed
