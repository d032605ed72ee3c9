// Private: the pickle opcodes the restricted machine knows by name (all of protocol 0-5, so that
// a refused opcode is named in its message too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "grouplin/error.hpp"

namespace grouplin::pickle {

// The opcodes the machine runs; every other one is refused with ForbiddenOpcode.
enum Opcode : uint8_t {
  kMark = '(',
  kStop = '.',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinPersId = 'Q',
  kReduce = 'R',
  kShortBinString = 'U',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kEmptyDict = '}',
  kAppends = 'e',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kEmptyList = ']',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kProto = 0x80,
  kNewObj = 0x81,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kEmptySet = 0x8f,
};

// The opcode's name in Python's pickletools ("BINUNICODE"), or "unknown".
const char* opcode_name(uint8_t op);

// Where the machine is. Every error it throws starts with "offset N: ", N the offset of the
// opcode being run; the parts of the machine share one Cursor to say so.
struct Cursor {
  size_t at = 0;   // offset of the opcode being run
  uint8_t op = 0;  // that opcode

  std::string op_name() const { return opcode_name(op); }
  [[noreturn]] void fail(ErrorCode code, const std::string& what) const;
  // fail(InvalidPickle, what): the pickle is well formed but builds something not allowed.
  [[noreturn]] void invalid(const std::string& what) const;
  // fail(PickleLimitExceeded, what + " (limit N)").
  [[noreturn]] void over(const std::string& what, size_t limit) const;
};

}  // namespace grouplin::pickle
