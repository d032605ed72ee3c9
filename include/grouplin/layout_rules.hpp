// Layout rules: how the experts of a grouped module are named in a checkpoint, declared as data.
//
//   grouplin::LayoutRules hf = grouplin::builtin_rules("hf");  // Qwen, OLMoE, DeepSeek names
//   grouplin::LayoutRules q = grouplin::builtin_rules("ernie4_5_moe");  // hf + Ernie's renames
//   grouplin::LayoutRules mine = grouplin::parse_rules(R"({"name": "mine", "tensors": [
//       {"stacked": "{prefix}w", "parts": ["{prefix}w{expert}"], "dims": ["out", "in"]}]})",
//       "inline rules");
//   std::cout << hf.name << ": " << hf.tensors.size() << " stacked tensors\n";
//
// A rule set names, for one module family, each stacked tensor and the per-expert tensors it is
// made of, and the renames that go with stacking. The engine (checkpoint_layout.hpp) does the
// rest both ways: stack a module list (MergeModulelist in transformers v5), concatenate
// several projections along a dim (Concatenate), transpose and interleave (the stacked-only
// families), and the inverses. docs/rules.md describes the JSON form and the model families.
// The built-in structures are:
//
//   te           TransformerEngine / Megatron: P.weight{i} [out, in] <-> P.weight [N, out, in];
//                P.bias{i} [out] <-> P.bias [N, out] (read also as [N, 1, out]); weight and bias
//                each in its own layout; FP8 scales P.weight{i}_scale_inv <->
//                P.weight_scale_inv [N, ...] (per tensor, [128, 128] or [1, 32] MX blocks).
//                A stacked P.weight alone (no stacked bias or scales beside it) counts only
//                with P._extra_state beside it or declared by GroupLin's safetensors metadata,
//                unless te is asked for by name (a lone rank-3 weight may be a convolution).
//                Its names are GroupedLinear's (grouped_linear_names)
//   hf           Hugging Face module lists (Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, GLM4-MoE, ...):
//                P.{E}.gate_proj.weight + P.{E}.up_proj.weight <-> P.gate_up_proj [N, 2I, H],
//                P.{E}.down_proj.weight <-> P.down_proj [N, H, I] (transformers v5's fused form),
//                and FP8 scales alike (P.{E}.gate_proj.weight_scale_inv <->
//                P.gate_up_proj_scale_inv, [128, 128] blocks)
//   hf-w1w3      the same with w1 (gate), w3 (up), w2 (down): LFM2-MoE
//   hf-mixtral   w1/w3/w2 under "block_sparse_moe.", which the fused form renames to "mlp." in
//                every key, the router's included: Mixtral, MiniMax
//   hf-fc        fc1 (gate), fc3 (up), fc2 (down)
//   hf-up-down   up_proj and down_proj without a gate (Nemotron-H)
//   stacked      experts stacked on the Hub already, [N, out, in] (GraniteMoE); no per-expert
//                names: per-expert output is TransformerEngine's P.gate_up_proj.weight{i}, only
//                when te is asked for
//   stacked-transposed  the same stored [N, in, out] (Llama 4, Aria)
//   gpt-oss      stored [N, in, out] with gate/up interleaved by column and expert biases
//
// and every model family of transformers (model_families()) is one of them plus its renames.
//
// Patterns: "{prefix}" is a key prefix (empty, or ending in '.'), "{expert}" an expert index
// (decimal, no leading zero, at most 9 digits: the rule of every expert name in GroupLin).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace grouplin {

// One stacked tensor of a module and the per-expert tensors it is made of.
struct StackedTensorRule {
  // Its name in the single layout: "{prefix}gate_up_proj".
  std::string stacked;
  // The per-expert tensors whose bytes make one expert's slice, concatenated along their first
  // dim in this order: {"{prefix}{expert}.gate_proj.weight", "{prefix}{expert}.up_proj.weight"}.
  std::vector<std::string> parts;
  // Names of each part's dims, checked to agree across the module's tensors ("out", "in"); the
  // parts' rank is dims.size(). The stacked tensor is [N, sum of the parts' first dims, ...].
  std::vector<std::string> dims;
  // A module may lack this tensor (a bias, FP8 scales). The first rule of a set is never optional:
  // it is what makes a prefix a module.
  bool optional = false;
  // The stacked tensor may also be saved with a unit dim after the experts ([N, 1, out]).
  bool unit_dim = false;
  // The stacked tensor holds each expert transposed: [N, in, out] for parts [out, in] (Llama 4,
  // gpt-oss compute x @ W). Needs two dims.
  bool transposed = false;
  // > 1: the stacked tensor interleaves this many equal groups of the expert's rows (in the parts'
  // [out, ...] orientation): row r of group g is its row r * interleave + g (gpt-oss's gate and up,
  // [..., ::2] and [..., 1::2]); the per-expert form holds the groups one after the other.
  int64_t interleave = 1;
  // The stacked tensor folds the experts into its first dim: [N * rows, ...] (DBRX's w1 [N * I, H])
  // instead of [N, rows, ...]; N then comes from LayoutRules::experts_from.
  bool folded = false;
  // When not empty ("{prefix}gate_up_proj"): this tensor holds the FP8 scales of that tensor of
  // the set, one per block of its values, multiplied into them when dequantizing. Its parts are
  // the scales of the weight's parts, and its shape is checked against the weight's blocks
  // instead of `dims`: [ceil(out / rows), ceil(in / cols)] per part for a block [rows, cols].
  std::string scale_of = {};
  // The block shapes a scale may have, tried in order ({128, 128}: DeepSeek-V3, Qwen3-FP8;
  // {1, 32}: MXFP8); an empty one is one scale per expert ([1] or [], Float8Tensor).
  std::vector<std::vector<int64_t>> blocks = {};
};

// Tensors that are not experts which a family's two forms store differently (transformers'
// Concatenate(dim=0) and Split(dim=0) of attention and convolution weights): `parts`, each a piece
// of a key, in one form are `whole` in the other, concatenated along their first dim in this
// order; or, `transposed`, one part that is the whole's transpose (transformers' Transpose(0, 1)
// of a rank-2 router or shared expert stored [in, out]). convert leaves both as they are; verify
// compares the whole with its parts' concatenation (or its part's transpose).
struct JoinedTensors {
  std::string whole;               // "conv1d.weight"
  std::vector<std::string> parts;  // {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}
  bool transposed = false;         // one part, [in, out] where the whole is [out, in]
};

// What the per-expert names of a rule set are.
enum class PerExpertForm {
  // The names checkpoints of the family use (module lists, TE's weight{i}): per-expert output is
  // an ordinary layout of the family.
  Native,
  // The family stores its experts stacked only; `parts` are TransformerEngine / Megatron names
  // (P.gate_up_proj.weight{i} [out, in]), written only when a set of GroupedLinear's names is
  // asked for beside it (the rules given holding te, LayoutRules::grouped_linear_names);
  // otherwise per-expert output is Error(NoPerExpertForm).
  TeOnly,
};

struct LayoutRules {
  std::string name;
  // Substring renames from the per-expert spelling to the single one, applied in order to every
  // key of a checkpoint written in the single layout, and undone in reverse order for the
  // per-expert layout. Stacked names are matched after the renames, so a family whose Hub names
  // of stacked experts differ from transformers v5's (GraniteMoE's input_linear.weight ->
  // experts.gate_up_proj) is a rename too. A TeOnly set's per-expert names are spelled like its
  // single ones: the renames apply to both. A source starting with '^' ("^head.weight") renames
  // the start of a key only.
  std::vector<std::pair<std::string, std::string>> renames;
  // When not empty ("model."): in a key starting with this text, renames (not anchored ones, nor
  // ones that look for this text) apply after it only, as transformers matches them below the
  // base model ("model.norm.weight" holds no ".norm.").
  std::string renames_after;
  // Tensors that are not experts joined in one form and split in the other (verify only).
  std::vector<JoinedTensors> joins;
  std::vector<StackedTensorRule> tensors;
  // Per-expert entries ordered expert by expert (0.gate, 0.up, 0.down, 1.gate, ...), as module
  // lists save them; otherwise tensor by tensor (weight0..weight{N-1}, bias0..), as TE does.
  bool expert_major = false;
  PerExpertForm per_expert = PerExpertForm::Native;
  // When not empty ("{prefix}_extra_state" for te): a module found as its stacked first tensor
  // alone counts only with this entry beside it, or when the checkpoint declares its prefix
  // (declared_modules(): the metadata GroupLin's convert writes), unless the set was
  // asked for by name. A lone rank-3 "P.weight" may be a convolution (conv1d [C, 1, K]); beside a
  // stacked P.bias [N, out] or its FP8 scales it is a module whatever else is there.
  std::string stacked_needs;
  // The set's names are GroupedLinear's own state-dict names (P.weight{i} / P.weight, P.bias{i} /
  // P.bias, P.weight{i}_scale_inv / P.weight_scale_inv: TransformerEngine's): a GroupedLinear at
  // P loads its entries in either layout as they are, and, asked for beside (or, with a model type
  // naming one, instead of) a stacked-only family's set (PerExpertForm::TeOnly), it asks for that
  // family's per-expert names instead of being a set of its own. Built-in: te.
  bool grouped_linear_names = false;
  // When not empty ("experts."): a module's prefix must end with this text. transformers calls
  // every module of experts "experts"; a list of dense MLPs (LongCat's mlps.0.gate_proj) is not
  // one.
  std::string prefix_ends_with;
  // When not empty ("{prefix}router.layer.weight"): the entry whose dim `experts_from_dim` is the
  // module's expert count, for sets with folded tensors (a folded shape does not tell it). A
  // module whose folded tensors have no such entry beside them is no module.
  std::string experts_from;
  int64_t experts_from_dim = 0;
};

// One model family of transformers v5's checkpoint conversion mapping, as GroupLin applies it.
struct ModelFamily {
  std::string model_type;  // config.json's "model_type": "qwen3_moe"
  std::string structure;   // the built-in set it builds on: "hf", "hf-mixtral", "gpt-oss", ...
  // Its own renames (transformers' literal WeightRenaming entries), after the structure's.
  std::vector<std::pair<std::string, std::string>> renames;
  // What of transformers' mapping for the type GroupLin does not apply ("" when nothing): renames
  // that are regular expressions, conversions of tensors that are not experts.
  std::string not_applied;
  // The conversions of `not_applied` that verify still follows (LayoutRules::joins).
  std::vector<JoinedTensors> joins = {};
  // LayoutRules::renames_after for the family. Renames scoped below "model." leave a base
  // model's own entries alone (DeepSeek-V4's ".norm." -> ".kv_norm." must not touch
  // model.norm.weight); a family whose renames aim at those entries (hy_v4's model.hc_pre.*) has
  // "" here, and its renames see whole keys.
  std::string renames_after = "model.";
};

// The families GroupLin knows, by model type (docs/rules.md has the table and the transformers
// version it was checked against).
const std::vector<ModelFamily>& model_families();
// The built-in structures (above), then every family's model type.
std::vector<std::string> builtin_rule_names();
// A built-in structure, or the set of a family by its model type (named after it: the
// structure's tensors, its renames then the family's). Throws Error(InvalidArgument) naming the
// structures for an unknown name.
LayoutRules builtin_rules(std::string_view name);
// The model type's own set name (the model type itself) when GroupLin knows the family; nullopt
// otherwise ("llama": no grouped experts).
std::optional<std::string> rules_for_model_type(std::string_view model_type);

// Parses a rule set from its JSON form (docs/rules.md). `source` names it in messages. Throws
// Error(InvalidRules) naming the source, the field and what is wrong: not JSON, unknown or
// missing fields or fields of the wrong type, a pattern without exactly one "{prefix}" at its
// start (and, for parts, one "{expert}"), no tensors, an optional first tensor, empty parts or
// dims, a transpose without two dims, a transpose, interleave or fold beside several parts, a
// folded tensor without experts_from (or the reverse), a rename with an empty side, a scale
// (scale_of) of no other weight tensor of the set, not optional, without blocks, with blocks not
// [] or two positive sizes, with another number of parts than its weight, or rearranged; a join
// without a whole or with fewer than two parts, or a part equal to its whole.
LayoutRules parse_rules(std::string_view json, const std::string& source);
// The JSON form of `rules` (docs/rules.md), fields at their defaults left out: what
// parse_rules reads back into an equal set.
std::string rules_to_json(const LayoutRules& rules);
// parse_rules of the file at `path`; also Error(IoError) if it cannot be read.
LayoutRules load_rules(const std::string& path);

}  // namespace grouplin
