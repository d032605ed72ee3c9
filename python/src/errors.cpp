// grouplin.Error from a C++ grouplin::Error: the same code (its name), message and problems.
// The exception classes are Python's own (grouplin/_errors.py), so that they pickle, print and
// document like any other; this file only fills them in.
#include <Python.h>

#include "bindings.hpp"
#include "grouplin/error.hpp"

namespace grouplin::python {
namespace {

void set_python_error(const Error& e) {
  nb::module_ errors = nb::module_::import_("grouplin._errors");
  nb::object problem_type = errors.attr("Problem");
  nb::list problems;
  for (const Problem& p : e.problems()) {
    problems.append(problem_type(std::string(error_code_name(p.code)), p.key, p.message));
  }
  nb::object type = errors.attr("Error");
  nb::object exc =
      type(std::string(e.what()), std::string(error_code_name(e.code())), e.message(), problems);
  PyErr_SetObject(type.ptr(), exc.ptr());
}

}  // namespace

void bind_errors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      try {
        set_python_error(e);
      } catch (nb::python_error& failed) {  // the package is broken: say so, with the message
        failed.restore();
      }
    }
  });
  m.def(
      "error_code_names",
      [] {
        std::vector<std::string> names;
#define GROUPLIN_NAME_ENTRY(name) names.push_back(#name);
        GROUPLIN_ERROR_CODES(GROUPLIN_NAME_ENTRY)
#undef GROUPLIN_NAME_ENTRY
        return names;
      },
      "Every error code's name, in the order of GroupLin's ErrorCode.");
  m.def(
      "raise_error",
      [](const std::string& code_name, const std::string& message) {
#define GROUPLIN_RAISE_ENTRY(name) \
  if (code_name == #name) throw Error(ErrorCode::name, message);
        GROUPLIN_ERROR_CODES(GROUPLIN_RAISE_ENTRY)
#undef GROUPLIN_RAISE_ENTRY
        throw Error(ErrorCode::InvalidArgument, "no error code " + quote(code_name));
      },
      "Raises grouplin.Error with this code and message, as the library would (for tests).");
}

}  // namespace grouplin::python
