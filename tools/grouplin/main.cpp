// grouplin: inspect, convert and verify grouped-layer checkpoints; demo and benchmark.
// Exit codes: 0 success, 1 a negative answer (verify), 2 bad usage or bad input; a command
// stopped by SIGINT or SIGTERM (convert) 128 + the signal number: 130, 143.
#include <algorithm>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/interrupt.hpp"
#include "grouplin/error.hpp"
#include "grouplin/runtime.hpp"
#include "grouplin/version.hpp"

int grouplin::cli::g_exit_code = 0;

std::string grouplin::cli::error_json(
    const Error& e, const std::vector<std::pair<std::string, std::string>>& inputs) {
  nlohmann::ordered_json doc = {{"schema_version", 1}};
  for (const auto& [key, value] : inputs) doc[key] = value;
  doc["error"] = {{"code", std::string(error_code_name(e.code()))}, {"message", e.message()}};
  return doc.dump(2, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
}

std::string grouplin::cli::name_list(const std::vector<std::string>& names, size_t max) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", " : "") + escaped(names[i]);
  if (names.size() > max) out += " and " + std::to_string(names.size() - max) + " more";
  return out;
}

void grouplin::cli::print_warnings(const std::vector<Problem>& warnings) {
  for (const Problem& w : warnings) {
    std::cerr << "grouplin: warning: " << error_code_name(w.code) << ": " << w.message << "\n";
  }
}

namespace {

// Help text a reader can use: each option's value as its placeholder (`--rules R`,
// `--layout single|per-expert|keep`, `--threads N`), not CLI11's type and validator names
// (`TEXT:{single,per-expert}`, `UINT:INT in [0 - 1000000]`); positionals by their names alone.
void tidy_help(CLI::App& app) {
  static const std::pair<const char*, const char*> kValues[] = {
      {"--rules", "R"},        {"--state-dict", "KEY"},
      {"--experts", "B:E"},    {"--max-shard-size", "SIZE"},
      {"--max-listed", "N"},   {"--out-dir", "DIR"},
      {"--plot-data", "FILE"}, {"--threads", "N"},
      {"--steps", "N"},        {"--seed", "N"},
      {"--num-experts", "N"},  {"--reps", "N"},
      {"--rows", "T"},         {"--fp8-rows", "N"},
      {"--shapes", "NAME"},    {"--routing", "NAME"},
      {"--ops", "NAME"},       {"--dtype", "DTYPE"}};
  for (CLI::App* sub : app.get_subcommands({})) tidy_help(*sub);
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type.empty() || opt->get_name() == "--help" || opt->get_name() == "-h,--help") continue;
    std::string value = "VALUE";
    if (const size_t open = type.find(":{"); open != std::string::npos) {  // a set of choices
      value = type.substr(open + 2, type.find('}', open) - open - 2);
      std::replace(value.begin(), value.end(), ',', '|');
    } else if (opt->get_positional()) {
      value = "";
    } else {
      for (const auto& [name, v] : kValues) {
        if (opt->check_lname(std::string(name).substr(2))) value = v;
      }
    }
    opt->type_name(value);
    for (int i = 0;; ++i) {  // the checks stay; only their descriptions leave the help
      try {
        opt->get_validator(i)->description("");
      } catch (const CLI::OptionNotFound&) {
        break;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "grouplin: the grouped linear layer of Mixture-of-Experts models, its weight layouts "
      "and checkpoints",
      "grouplin"};
  // The kernels line names what runs here: the instruction set chosen (GROUPLIN_ISA caps it)
  // and what the CPU offers; "none" when GROUPLIN_ISA is refused, which main then reports.
  app.set_version_flag(
      "--version",
      [] {
        std::string isa = "none";
        try {
          isa = grouplin::kernel_isa();
        } catch (const grouplin::Error&) {
        }
        return "grouplin " + std::string(grouplin::version()) + "\nkernels: " + isa +
               " (cpu: " + grouplin::cpu_features() + ")";
      },
      "print GroupLin's version and the kernels' instruction set, and exit");
  app.require_subcommand(1);
  // The kernels' environment (GROUPLIN_ISA, GROUPLIN_NUM_THREADS) is read once parsing is done,
  // before any command runs: a bad value is one error at startup, not a failure after a command
  // has printed half its output (demo) or on its first kernel call. --help still answers.
  app.parse_complete_callback([] {
    (void)grouplin::kernel_isa();
    (void)grouplin::num_threads();
  });
  grouplin::cli::add_inspect_command(app);
  grouplin::cli::add_convert_command(app);
  grouplin::cli::add_verify_command(app);
  grouplin::cli::add_rules_command(app);
  grouplin::cli::add_demo_command(app);
  grouplin::cli::add_bench_command(app);
  tidy_help(app);
  // A mistyped command: named, with the closest one (CLI11 alone says "A subcommand is
  // required").
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> commands;
    for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
    if (std::find(commands.begin(), commands.end(), argv[1]) == commands.end()) {
      std::string list;
      for (const std::string& c : commands) list += (list.empty() ? "" : ", ") + c;
      std::cerr << "grouplin: InvalidArgument: unknown command " << grouplin::quote(argv[1])
                << grouplin::did_you_mean(argv[1], commands) << " (commands: " << list
                << "; grouplin --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    const int status = app.exit(e);
    try {
      (void)grouplin::kernel_isa();
    } catch (const grouplin::Error& bad) {
      std::cerr << "grouplin: " << bad.what() << "\n";
      return 2;
    }
    return status;
  } catch (const CLI::ParseError& e) {
    // A usage error in GroupLin's own form (docs/cli.md): code, message, where help is.
    std::string command = "grouplin";
    for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
    std::cerr << "grouplin: InvalidArgument: " << e.what() << " (" << command << " --help)\n";
    return 2;
  } catch (const grouplin::Error& e) {
    std::cerr << "grouplin: " << e.what() << "\n";
    if (e.code() == grouplin::ErrorCode::Interrupted) {
      return grouplin::cli::interrupted_exit_status();
    }
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "grouplin: error: " << e.what() << "\n";
    return 2;
  }
  return grouplin::cli::g_exit_code;
}
