// Agreeing on failures before data moves: every collective entry point checks its inputs locally,
// then all ranks learn whether any failed and, if so, throw the same Error. A rank that threw on
// its own would leave the others waiting in the next collective forever.
#include <climits>
#include <nlohmann/json.hpp>

#include "distributed/mpi_call.hpp"
#include "grouplin/expert_parallel.hpp"

namespace grouplin::distributed {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(ErrorCode::MpiError, std::string(call) + " failed: " + std::string(text, length));
}

int comm_rank(MPI_Comm comm) {
  int r = 0;
  check_mpi(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

int comm_size(MPI_Comm comm) {
  int n = 0;
  check_mpi(MPI_Comm_size(comm, &n), "MPI_Comm_size");
  return n;
}

namespace {

// The error as text for the broadcast: its code (by value: every rank runs the same build), its
// message and its problems.
std::string encode(const Error& e) {
  nlohmann::json problems = nlohmann::json::array();
  for (const Problem& p : e.problems()) {
    problems.push_back({static_cast<int>(p.code), p.key, p.message});
  }
  return nlohmann::json{
      {"code", static_cast<int>(e.code())}, {"message", e.message()}, {"problems", problems}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Error decode(const std::string& text, int rank, int ranks) {
  const nlohmann::json j = nlohmann::json::parse(text);
  const std::string where = "rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ": ";
  std::vector<Problem> problems;
  for (const auto& p : j.at("problems")) {
    problems.push_back({static_cast<ErrorCode>(p.at(0).get<int>()), p.at(1).get<std::string>(),
                        p.at(2).get<std::string>()});
  }
  const auto code = static_cast<ErrorCode>(j.at("code").get<int>());
  const std::string message = where + j.at("message").get<std::string>();
  if (problems.size() <= 1) return Error(code, message);
  return Error(code, message, std::move(problems));
}

}  // namespace

void raise_agreed(MPI_Comm comm, const std::optional<Error>& failure) {
  const int rank = comm_rank(comm), ranks = comm_size(comm);
  int mine = failure ? rank : INT_MAX, first = INT_MAX;
  check_mpi(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (first == INT_MAX) return;
  std::string text = rank == first ? encode(*failure) : std::string();
  long long length = static_cast<long long>(text.size());
  check_mpi(MPI_Bcast(&length, 1, MPI_LONG_LONG, first, comm), "MPI_Bcast");
  text.resize(static_cast<size_t>(length));
  check_mpi(MPI_Bcast(text.data(), static_cast<int>(length), MPI_CHAR, first, comm), "MPI_Bcast");
  throw decode(text, first, ranks);
}

std::vector<std::vector<int64_t>> gather_agreed(MPI_Comm comm, const std::optional<Error>& failure,
                                                const std::vector<int64_t>& header) {
  const int ranks = comm_size(comm);
  // Slot 0 says whether the rank failed; a failure is then told by raise_agreed, whose
  // collectives every rank enters because every rank sees the flag.
  std::vector<int64_t> mine(header.size() + 1);
  mine[0] = failure ? 1 : 0;
  std::copy(header.begin(), header.end(), mine.begin() + 1);
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(ranks));
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                          static_cast<int>(mine.size()), MPI_INT64_T, comm),
            "MPI_Allgather");
  bool any = false;
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const auto* row = all.data() + static_cast<size_t>(r) * mine.size();
    any = any || row[0] != 0;
    rows[static_cast<size_t>(r)].assign(row + 1, row + mine.size());
  }
  if (any) raise_agreed(comm, failure);
  return rows;
}

}  // namespace grouplin::distributed

namespace grouplin {

void agree_on(MPI_Comm comm, const std::function<void()>& check) {
  distributed::raise_agreed(comm, distributed::failure_of(check));
}

}  // namespace grouplin
