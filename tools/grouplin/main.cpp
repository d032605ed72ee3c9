// grouplin: inspect, convert and verify grouped-layer checkpoints; demo and benchmark.
// Exit codes: 0 success, 1 a negative answer (verify), 2 bad usage or bad input; a command
// stopped by SIGINT or SIGTERM (convert) 128 + the signal number: 130, 143.
#include <exception>
#include <iostream>
#include <string>

#include "grouplin/commands.hpp"
#include "grouplin/error.hpp"
#include "grouplin/interrupt.hpp"
#include "grouplin/runtime.hpp"
#include "grouplin/version.hpp"

int grouplin::cli::g_exit_code = 0;

int main(int argc, char** argv) {
  CLI::App app{
      "grouplin: the grouped linear layer of Mixture-of-Experts models, its weight layouts "
      "and checkpoints"};
  // The kernels line names what runs here: the instruction set chosen (GROUPLIN_ISA caps it)
  // and what the CPU offers.
  app.set_version_flag(
      "--version",
      [] {
        return "grouplin " + std::string(grouplin::version()) +
               "\nkernels: " + grouplin::kernel_isa() + " (cpu: " + grouplin::cpu_features() + ")";
      },
      "print GroupLin's version and the kernels' instruction set, and exit");
  app.require_subcommand(1);
  grouplin::cli::add_inspect_command(app);
  grouplin::cli::add_convert_command(app);
  grouplin::cli::add_verify_command(app);
  grouplin::cli::add_rules_command(app);
  grouplin::cli::add_demo_command(app);
  grouplin::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
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
