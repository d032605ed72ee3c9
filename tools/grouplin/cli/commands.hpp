// The grouplin subcommands. Each add_*_command registers its options on the app and sets a
// callback that runs the command; the callbacks throw grouplin::Error for bad input, which
// main() turns into exit code 2.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "grouplin/error.hpp"

namespace grouplin::cli {

// Exit status a command asks main() to return (0 unless a command says otherwise).
extern int g_exit_code;

// Writes each warning to stderr as "grouplin: warning: <CodeName>: <message>": what an input gets
// wrong without stopping the command (its exit status stays as it is).
void print_warnings(const std::vector<Problem>& warnings);

// The JSON document of a command that failed under --json: {"schema_version": 1, then the
// inputs as its document names them ("file"; "input", "output"; "a", "b"), then "error":
// {"code": ..., "message": ...}} (docs/cli.md), pure ASCII.
std::string error_json(const Error& e,
                       const std::vector<std::pair<std::string, std::string>>& inputs);

// "a, b, c" escaped, at most `max` names then "and N more".
std::string name_list(const std::vector<std::string>& names, size_t max = 8);

void add_demo_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_verify_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_rules_command(CLI::App& app);

}  // namespace grouplin::cli
