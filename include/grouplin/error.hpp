// GroupLin errors: one exception type carrying a named code and a message.
//
//   try {
//     throw grouplin::Error(grouplin::ErrorCode::SplitSumMismatch,  // as GroupedLinear::forward
//                           "m_splits sum to 7, expected T = 8 (rows of x)");
//   } catch (const grouplin::Error& e) {
//     if (e.code() == grouplin::ErrorCode::SplitSumMismatch) std::cerr << "bad routing\n";
//     std::cerr << e.what() << "\n";  // names the argument, the expected and the actual value
//     for (const grouplin::Problem& p : e.problems()) std::cerr << p.key << ": " << p.message;
//   }
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace grouplin {

// Every way GroupLin can fail has a name here. The list is an X-macro so that the enum, the
// name table and the test that walks every code cannot drift apart. Most names say what they
// mean; a few need a word:
//   Truncated    a file ends before what its own structure promises (or shrank while read).
//   Interrupted  the caller stopped an operation before it finished (Ctrl-C, SIGTERM: the CLI
//                throws it from convert's progress callback); nothing was left behind. The CLI
//                exits with 128 + the signal number for it (130 for SIGINT), not 2.
//   RanksDisagree  the ranks of an expert-parallel job were given different things that must be
//                  the same on all (layer shapes, dtypes, expert counts).
//   OutputHoldsOtherFiles  convert was asked to replace (overwrite) a directory that holds more
//                than a checkpoint: files a conversion neither writes nor copies from its input.
//   ScaleWithoutWeight  FP8 scales (W_scale_inv) whose weight W is not in the checkpoint: inspect
//                reports it, convert --dtype warns that it passes through as it is.
//   NothingToDequantize  convert --dtype found no FP8 weight with its scales to write as values.
//   NothingToChange  convert keeping the layout (no --layout) with nothing else asked for: the
//                output would be a copy.
//   AmbiguousTeDType  never thrown: the note (PtReadOptions::notes) of a TransformerEngine
//                Float8Tensor whose dtype code means float8 e4m3 or e5m2 depending on the TE
//                release that wrote it, read as the later releases' (docs/pt-format.md).
//   ModelTypeAssumed  never thrown: verify's warning that one input, naming no model family,
//                was read by the other's (config.json on one side only), or that they differ.
//   EntriesSkipped  never thrown: the note (PtReadOptions::notes) of a .pt whose plain values
//                beside the tensors (None, numbers, strings), or whose training-checkpoint
//                wrapper around the state dict, were left out.
//   SeveralStateDicts  a .pt training checkpoint holds several dicts of tensors (Megatron's
//                model0, model1, ...) and none was named (PtReadOptions::state_dict_key).
//   TotalSizeMismatch  never thrown: the code of a warning (Problem in Checkpoint::warnings) for
//                a directory index whose total_size is not its tensors' bytes.
#define GROUPLIN_ERROR_CODES(X) \
  /* Arguments and shapes. */   \
  X(InvalidArgument)            \
  X(ShapeMismatch)              \
  X(DTypeMismatch)              \
  X(UnsupportedDType)           \
  X(SizeOverflow)               \
  X(OutOfBounds)                \
  X(ReadOnlyTensor)             \
  X(NotStackable)               \
  X(UndefinedTensor)            \
  /* GroupedLinear. */          \
  X(SplitCountMismatch)         \
  X(NegativeSplit)              \
  X(SplitSumMismatch)           \
  X(BackwardBeforeForward)      \
  X(InvalidEnvironment)         \
  /* State dicts. */            \
  X(MissingKey)                 \
  X(UnexpectedKey)              \
  X(PartialExpertSet)           \
  X(BothLayoutsPresent)         \
  X(ExpertCountMismatch)        \
  X(UnsupportedConversion)      \
  X(Fp8ScalesNotApplied)        \
  X(Fp8WeightsNotTrainable)     \
  X(DuplicateName)              \
  X(LoadFailed)                 \
  /* Layout rules. */           \
  X(InvalidRules)               \
  X(RuleMatchedNothing)         \
  X(NoGroupedModules)           \
  X(RuleConflict)               \
  X(NoPerExpertForm)            \
  X(ScaleShapeMismatch)         \
  X(ScaleBlocksUnaligned)       \
  X(ScaleWithoutWeight)         \
  X(AmbiguousTeDType)           \
  X(ModelTypeAssumed)           \
  X(EntriesSkipped)             \
  X(SeveralStateDicts)          \
  X(NothingToDequantize)        \
  X(NothingToChange)            \
  /* Files in general. */       \
  X(IoError)                    \
  X(UnknownFormat)              \
  X(FileTooSmall)               \
  X(Truncated)                  \
  X(OutputHoldsOtherFiles)      \
  X(CopyDropped)                \
  /* Stopped by the caller. */  \
  X(Interrupted)                \
  /* Sharded directories. */    \
  X(InvalidIndex)               \
  X(UnsafePath)                 \
  X(ShardMissing)               \
  X(TensorNotInShard)           \
  X(TensorNotInIndex)           \
  X(TotalSizeMismatch)          \
  /* safetensors. */            \
  X(HeaderTooLarge)             \
  X(HeaderPastEnd)              \
  X(InvalidHeader)              \
  X(InvalidMetadata)            \
  X(UnknownDType)               \
  X(InvalidOffsets)             \
  X(OffsetsNotContiguous)       \
  X(TensorSizeMismatch)         \
  X(TrailingBytes)              \
  /* zip archives. */           \
  X(InvalidZip)                 \
  X(CompressedEntry)            \
  X(EncryptedEntry)             \
  X(ZipHeaderMismatch)          \
  X(CrcMismatch)                \
  X(MissingRecord)              \
  /* pickles. */                \
  X(ForbiddenOpcode)            \
  X(ForbiddenGlobal)            \
  X(PickleStackError)           \
  X(PickleLimitExceeded)        \
  X(InvalidPickle)              \
  X(StorageTooSmall)            \
  X(StorageSizeMismatch)        \
  /* Expert parallelism. */     \
  X(ExpertsNotDivisible)        \
  X(RanksDisagree)              \
  X(MpiError)

enum class ErrorCode {
#define GROUPLIN_ENUM_ENTRY(name) name,
  GROUPLIN_ERROR_CODES(GROUPLIN_ENUM_ENTRY)
#undef GROUPLIN_ENUM_ENTRY
};

// Returns the code's name as written in the enum ("SplitSumMismatch").
std::string_view error_code_name(ErrorCode code);

// `text` made safe to print on a terminal: bytes that are not valid UTF-8 become \xNN, control
// characters (C0, DEL, C1) and Unicode direction controls become \xNN or \uNNNN, a backslash
// becomes two. A name read from a file can then never move the cursor, recolour or reorder the
// line it is printed on. Everything else, non-ASCII letters included, is kept.
std::string escaped(std::string_view text);

// `name` escaped as above (and '"' as \") in double quotes, cut after 512 bytes with
// "... (N bytes)": how messages and listings name a file, key or record ("model.pt").
std::string quote(std::string_view name);

// For a message about a name that is not one of `known`: `; did you mean "x"?` naming the known
// name closest to `got` (case, '-' and '_' aside, at most a third of its letters off), or "".
//   "unknown command " + quote(cmd) + did_you_mean(cmd, {"inspect", "convert"})
std::string did_you_mean(std::string_view got, const std::vector<std::string>& known);

// One problem of an Error, as data: what a program needs to act on it without parsing text.
struct Problem {
  ErrorCode code;
  std::string key;      // the dotted state-dict key, tensor or file it concerns ("" if none)
  std::string message;  // this problem alone, without the code prefix
};

// The only exception GroupLin throws on purpose. what() is "<CodeName>: <message>".
//
// Most errors are one problem. A check that finds several reports them all in one Error:
// load_state_dict throws LoadFailed when its problems have different codes (or their common
// code when they share one), and problems() lists each with its exact key:
//
//   catch (const grouplin::Error& e) {
//     for (const grouplin::Problem& p : e.problems())
//       if (p.code == grouplin::ErrorCode::MissingKey) missing.push_back(p.key);
//   }
class Error : public std::runtime_error {
 public:
  // One problem, concerning no particular key.
  Error(ErrorCode code, const std::string& message);
  // An error made of `problems` (at least one), summarised by `code` and `message`.
  Error(ErrorCode code, const std::string& message, std::vector<Problem> problems);

  ErrorCode code() const noexcept { return code_; }
  // The message without the code prefix.
  const std::string& message() const noexcept { return message_; }
  // Every problem, in the order found; one entry {code(), "", message()} for a simple error.
  const std::vector<Problem>& problems() const noexcept { return problems_; }

 private:
  ErrorCode code_;
  std::string message_;
  std::vector<Problem> problems_;
};

}  // namespace grouplin
