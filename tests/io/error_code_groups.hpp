// Error codes that no checkpoint reader raises for the content of a file, for the readers'
// "every error code is covered or excluded" tests: each reader's test adds the codes of the other
// file format, so that a new code forces a decision in both.
#pragma once

#include "grouplin/error.hpp"

namespace grouplin::test_io {

// Arguments, tensors, layers, state dicts, opening or mapping the file (IoError, tested in
// mapped_file_test.cpp), and a caller stopping the work (Interrupted, tested in
// tests/tools/cli_test.cpp): raised by other layers, never by parsing a file's bytes.
inline bool raised_outside_file_parsing(ErrorCode code);

// A checkpoint directory's index and its agreement with the shards
// (tests/io/sharded_checkpoint_test.cpp walks them; TotalSizeMismatch is only ever a warning,
// tested there too): never a single file's reader.
inline bool raised_only_by_checkpoint_directories(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidIndex:
    case ErrorCode::UnsafePath:
    case ErrorCode::ShardMissing:
    case ErrorCode::TensorNotInShard:
    case ErrorCode::TensorNotInIndex:
    case ErrorCode::TotalSizeMismatch:
      return true;
    default:
      return false;
  }
}

inline bool raised_outside_file_parsing(ErrorCode code) {
  if (raised_only_by_checkpoint_directories(code)) return true;
  switch (code) {
    case ErrorCode::InvalidArgument:  // only for a null storage argument, not for file content
    case ErrorCode::ShapeMismatch:
    case ErrorCode::DTypeMismatch:
    case ErrorCode::OutOfBounds:
    case ErrorCode::ReadOnlyTensor:
    case ErrorCode::NotStackable:
    case ErrorCode::UndefinedTensor:
    case ErrorCode::SplitCountMismatch:
    case ErrorCode::NegativeSplit:
    case ErrorCode::SplitSumMismatch:
    case ErrorCode::BackwardBeforeForward:
    case ErrorCode::InvalidEnvironment:
    case ErrorCode::MissingKey:
    case ErrorCode::UnexpectedKey:
    case ErrorCode::PartialExpertSet:
    case ErrorCode::BothLayoutsPresent:
    case ErrorCode::ExpertCountMismatch:
    case ErrorCode::UnsupportedConversion:
    case ErrorCode::Fp8ScalesNotApplied:
    case ErrorCode::Fp8WeightsNotTrainable:
    case ErrorCode::LoadFailed:
    case ErrorCode::InvalidRules:
    case ErrorCode::RuleMatchedNothing:
    case ErrorCode::NoGroupedModules:
    case ErrorCode::RuleConflict:
    case ErrorCode::NoPerExpertForm:
    case ErrorCode::ScaleShapeMismatch:
    case ErrorCode::ScaleBlocksUnaligned:
    case ErrorCode::ScaleWithoutWeight:
    case ErrorCode::AmbiguousTeDType:  // a note, never thrown
    case ErrorCode::ModelTypeAssumed:  // a warning of verify, never thrown
    case ErrorCode::NothingToDequantize:
    case ErrorCode::NothingToChange:
    case ErrorCode::IoError:
    case ErrorCode::OutputHoldsOtherFiles:  // about convert's output, never a file's content
    case ErrorCode::CopyDropped:            // a warning (PtReadOptions::notes), never thrown
    case ErrorCode::EntriesSkipped:         // a note (PtReadOptions::notes), never thrown
    case ErrorCode::SeveralStateDicts:      // the caller must choose, the file is fine
    case ErrorCode::Interrupted:  // thrown by a caller's callback (the CLI on Ctrl-C), never a file
    case ErrorCode::ExpertsNotDivisible:  // expert parallelism (grouplin_mpi)
    case ErrorCode::RanksDisagree:
    case ErrorCode::MpiError:
      return true;
    default:
      return false;
  }
}

}  // namespace grouplin::test_io
