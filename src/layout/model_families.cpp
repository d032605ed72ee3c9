// The model families of transformers v5's checkpoint conversion mapping
// (transformers/conversion_mapping.py), as GroupLin applies them: each model type's structure
// (the built-in set of src/layout/builtin_rules.cpp its experts follow) and the renames that go
// with stacking them. Data only; bench/hf_rules_table.py checks it against an installed
// transformers and prints the rows that changed. Checked against transformers 5.24.0.
//
// A renaming of transformers that is a regular expression, and a conversion of tensors that are
// not experts, is not applied: `not_applied` says what, and `grouplin rules` shows it. A family
// with no structure is one GroupLin cannot convert exactly; `not_applied` says why.
#include "grouplin/layout_rules.hpp"

namespace grouplin {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
    {"afmoe", "hf", {}, ""},
    {"aria_text", "stacked-transposed", {{"mlp.experts.fc1.weight", "mlp.experts.gate_up_proj"}, {"mlp.experts.fc2.weight", "mlp.experts.down_proj"}}, ""},
    {"axk1", "hf", {{"post_mlp_layernorm", "mlp.post_mlp_layernorm"}}, ""},
    {"axk2", "hf", {{"W_down", "mlp.fc1"}, {"W_up", "mlp.fc2"}, {"self_attn.q_b_proj.", "self_attn.q_gate_proj."}}, ""},
    {"bailing_hybrid", "hf", {{"^model.word_embeddings.", "model.embed_tokens."}, {".attention.", ".self_attn."}, {"self_attn.f_proj.", "self_attn.forget_gate.f_proj."}, {"self_attn.dt_bias", "self_attn.forget_gate.dt_bias"}, {"self_attn.A_log", "self_attn.forget_gate.A_log"}, {".self_attn.dense.", ".self_attn.o_proj."}, {".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias"}}, "q_conv1d.weight, k_conv1d.weight, v_conv1d.weight -> conv1d.weight (Concatenate; not experts)"},
    {"beam", "hf", {}, ""},
    {"cohere2_moe", "hf", {}, ""},
    {"dbrx", "", {}, "experts folded into dim 0 of w1, v1, w2 [N * I, H]: the expert count is in no shape"},
    {"deepseek_ocr2", "hf", {{"sam_model.patch_embed.proj.", "vision_tower.sam_encoder.patch_embed.projection."}, {"sam_model.pos_embed", "vision_tower.sam_encoder.pos_embed"}, {"sam_model.neck.0.", "vision_tower.sam_encoder.neck.conv1."}, {"sam_model.neck.1.", "vision_tower.sam_encoder.neck.layer_norm1."}, {"sam_model.neck.2.", "vision_tower.sam_encoder.neck.conv2."}, {"sam_model.neck.3.", "vision_tower.sam_encoder.neck.layer_norm2."}, {"sam_model.net_2.", "vision_tower.sam_encoder.proj.conv1."}, {"sam_model.net_3.", "vision_tower.sam_encoder.proj.conv2."}, {"qwen2_model.model.model.layers.", "vision_tower.vision_encoder.layers."}, {"qwen2_model.model.model.norm.", "vision_tower.vision_encoder.norm."}, {"qwen2_model.query_768.", "vision_tower.query_768_resolution."}, {"qwen2_model.query_1024.", "vision_tower.query_1024_resolution."}, {"projector.layers.", "multi_modal_projector."}, {"view_seperator", "view_separator"}}, "rename sam_model\\.blocks\\.(\\d+)\\.norm1\\. -> vision_tower.sam_encoder.layers.\\1.layer_norm1. (a regular expression); rename sam_model\\.blocks\\.(\\d+)\\.norm2\\. -> vision_tower.sam_encoder.layers.\\1.layer_norm2. (a regular expression); rename sam_model\\.blocks\\.(\\d+)\\.attn\\. -> vision_tower.sam_encoder.layers.\\1.attn. (a regular expression); rename sam_model\\.blocks\\.(\\d+)\\.mlp\\. -> vision_tower.sam_encoder.layers.\\1.mlp. (a regular expression); rename (^|model\\.)embed_tokens\\. -> \\1language_model.embed_tokens. (a regular expression); rename (^|model\\.)layers\\. -> \\1language_model.layers. (a regular expression); rename (^|model\\.)norm\\. -> \\1language_model.norm. (a regular expression)"},
    {"deepseek_v2", "hf", {}, ""},
    {"deepseek_v3", "hf", {}, ""},
    {"deepseek_v32", "hf", {}, ""},
    {"deepseek_v4", "hf-w1w3", {{".attn.", ".self_attn."}, {".ffn.", ".mlp."}, {".indexer.compressor.", ".compressor.indexer."}, {"^embed.weight", "embed_tokens.weight"}, {"^head.weight", "lm_head.weight"}, {"^hc_head_fn", "hc_head.hc_fn"}, {"^hc_head_base", "hc_head.hc_base"}, {"^hc_head_scale", "hc_head.hc_scale"}, {".attn_norm.", ".input_layernorm."}, {".ffn_norm.", ".post_attention_layernorm."}, {".hc_attn_fn", ".attn_hc.fn"}, {".hc_attn_base", ".attn_hc.base"}, {".hc_attn_scale", ".attn_hc.scale"}, {".hc_ffn_fn", ".ffn_hc.fn"}, {".hc_ffn_base", ".ffn_hc.base"}, {".hc_ffn_scale", ".ffn_hc.scale"}, {".attn_sink", ".sinks"}, {".indexer.weights_proj.", ".compressor.indexer.scorer.weights_proj."}, {".indexer.wq_b.", ".compressor.indexer.q_b_proj."}, {".norm.", ".kv_norm."}, {".ape", ".position_bias"}, {".wq_a.", ".q_a_proj."}, {".self_attn.wq_b.", ".self_attn.q_b_proj."}, {".wkv.", ".kv_proj."}, {".wgate.", ".gate_proj."}, {".wo_a.", ".o_a_proj."}, {".wo_b.", ".o_b_proj."}, {".q_norm.", ".q_a_norm."}, {".gate.bias", ".gate.e_score_correction_bias"}, {".shared_experts.w1.", ".shared_experts.gate_proj."}, {".shared_experts.w2.", ".shared_experts.down_proj."}, {".shared_experts.w3.", ".shared_experts.up_proj."}}, ""},
    {"dots1", "hf", {}, ""},
    {"dots3_note_vision_encoder", "hf-fc", {{"^post_trunk_norm.", "norm."}, {"^adapter.", "merger."}, {".mlp.gate_weight", ".mlp.gate.weight"}, {".mlp.router_bias", ".mlp.e_score_correction_bias"}}, "rename (blocks\\.\\d+)\\.norm_1\\. -> \\1.norm1. (a regular expression); rename (blocks\\.\\d+)\\.norm_2\\. -> \\1.norm2. (a regular expression); rename (blocks\\.\\d+\\.mlp)\\.fc1\\. -> \\1.gate_proj. (a regular expression); rename (blocks\\.\\d+\\.mlp)\\.fc2\\. -> \\1.down_proj. (a regular expression); rename (blocks\\.\\d+\\.mlp)\\.fc3\\. -> \\1.up_proj. (a regular expression)"},
    {"ernie4_5_moe", "hf", {{"mlp.moe_statics.e_score_correction_bias", "mlp.gate.moe_statics.e_score_correction_bias"}}, ""},
    {"ernie4_5_vl_moe", "", {}, "experts split into text and vision halves (ErnieFuseAndSplitTextVisionExperts)"},
    {"exaone_moe", "hf", {{"mlp.e_score_correction_bias", "mlp.gate.e_score_correction_bias"}}, ""},
    {"flex_olmo", "hf", {}, ""},
    {"flint", "hf", {{"self_attn.softmax_offset", "self_attn.sinks"}}, ""},
    {"gemma4_text", "stacked", {}, ""},
    {"glm4_moe", "hf", {}, ""},
    {"glm4_moe_lite", "hf", {}, ""},
    {"glm4v_moe", "hf", {}, ""},
    {"glm5_next", "hf", {{"self_attn.f_a_proj.", "self_attn.forget_gate.f_a_proj."}, {"self_attn.f_b_proj.", "self_attn.forget_gate.f_b_proj."}, {"self_attn.dt_bias", "self_attn.forget_gate.dt_bias"}, {"self_attn.A_log", "self_attn.forget_gate.A_log"}, {"hc_attn_fn", "attn_hc.fn"}, {"hc_attn_base", "attn_hc.base"}, {"hc_attn_scale", "attn_hc.scale"}, {"hc_ffn_fn", "ffn_hc.fn"}, {"hc_ffn_base", "ffn_hc.base"}, {"hc_ffn_scale", "ffn_hc.scale"}}, "self_attn.q_conv1d.weight, self_attn.k_conv1d.weight, self_attn.v_conv1d.weight -> self_attn.conv1d.weight (Concatenate; not experts)"},
    {"glm5_next_text", "hf", {{"self_attn.f_a_proj.", "self_attn.forget_gate.f_a_proj."}, {"self_attn.f_b_proj.", "self_attn.forget_gate.f_b_proj."}, {"self_attn.dt_bias", "self_attn.forget_gate.dt_bias"}, {"self_attn.A_log", "self_attn.forget_gate.A_log"}, {"hc_attn_fn", "attn_hc.fn"}, {"hc_attn_base", "attn_hc.base"}, {"hc_attn_scale", "attn_hc.scale"}, {"hc_ffn_fn", "ffn_hc.fn"}, {"hc_ffn_base", "ffn_hc.base"}, {"hc_ffn_scale", "ffn_hc.scale"}}, "self_attn.q_conv1d.weight, self_attn.k_conv1d.weight, self_attn.v_conv1d.weight -> self_attn.conv1d.weight (Concatenate; not experts)"},
    {"glm_moe_dsa", "hf", {}, ""},
    {"gpt_oss", "gpt-oss", {}, ""},
    {"granitemoe", "stacked", {{"block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj"}, {"block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj"}, {"block_sparse_moe.router.layer.weight", "block_sparse_moe.router.weight"}}, ""},
    {"granitemoe_swa", "stacked", {}, ""},
    {"granitemoehybrid", "stacked", {{"block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj"}, {"block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj"}, {"block_sparse_moe.router.layer.weight", "block_sparse_moe.router.weight"}}, ""},
    {"granitemoeshared", "stacked", {{"block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj"}, {"block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj"}, {"block_sparse_moe.router.layer.weight", "block_sparse_moe.router.weight"}}, ""},
    {"hunyuan_v1_moe", "hf", {}, ""},
    {"hy_v3", "hf", {{"mlp.router.gate.weight", "mlp.gate.weight"}, {"mlp.expert_bias", "mlp.e_score_correction_bias"}, {"mlp.shared_mlp.", "mlp.shared_experts."}}, ""},
    {"hy_v4", "stacked", {{".hc_pre.hc_", ".hc_"}, {".learnable_sink_param", ".sinks"}, {".linear_gate", ".gate_proj"}, {".hc_attn_layer.hc_fn", ".attn_hc.fn"}, {".hc_attn_layer.hc_base", ".attn_hc.base"}, {".hc_attn_layer.hc_scale", ".attn_hc.scale"}, {".hc_mlp_layer.hc_fn", ".ffn_hc.fn"}, {".hc_mlp_layer.hc_base", ".ffn_hc.base"}, {".hc_mlp_layer.hc_scale", ".ffn_hc.scale"}, {".hc_head_fn", ".hc_fn"}, {".hc_head_base", ".hc_base"}, {".hc_head_scale", ".hc_scale"}}, ""},
    {"inkling2_loop_text", "", {}, "w13 experts interleaved with their quantization scales (Interleave)"},
    {"inkling2_text", "", {}, "w13 experts interleaved with their quantization scales (Interleave)"},
    {"inkling_mm_model", "", {}, "w13 experts interleaved (Interleave), shared experts chunked"},
    {"inkling_text", "stacked", {}, ""},
    {"jamba", "hf", {}, ""},
    {"jetmoe", "stacked-linear", {}, ""},
    {"kimi_k25", "hf", {{"language_model.model", "model.language_model"}, {"language_model.lm_head", "lm_head"}, {"vision_tower.encoder", "model.vision_tower"}, {"mm_projector.proj.0", "model.mm_projector.in_proj"}, {"mm_projector.proj.2", "model.mm_projector.out_proj"}, {"blocks", "layers"}, {"vision_tower.patch_embed.pos_emb.weight", "model.vision_tower.patch_embed.pos_emb.position_embeddings"}}, "vision_tower.encoder.blocks.(\\d+).norm0, vision_tower.encoder.blocks.(\\d+).norm1 -> vision_tower.encoder.blocks.\\1.norm1, vision_tower.encoder.blocks.\\1.norm2 (GroupWeightRename; not experts); vision_tower.encoder.blocks.(\\d+).mlp.fc0, vision_tower.encoder.blocks.(\\d+).mlp.fc1 -> vision_tower.encoder.blocks.\\1.mlp.fc1, vision_tower.encoder.blocks.\\1.mlp.fc2 (GroupWeightRename; not experts); rename vision_tower.encoder.blocks.(\\d+).wo -> vision_tower.encoder.blocks.\\1.attn.proj (a regular expression); wqkv -> attn.q_proj, attn.k_proj, attn.v_proj (Chunk+PermuteForRope; not experts)"},
    {"kimi_linear", "hf-mixtral", {{"self_attn.f_a_proj.", "self_attn.forget_gate.f_a_proj."}, {"self_attn.f_b_proj.", "self_attn.forget_gate.f_b_proj."}, {"self_attn.dt_bias", "self_attn.forget_gate.dt_bias"}, {"self_attn.A_log", "self_attn.forget_gate.A_log"}}, "self_attn.q_conv1d.weight, self_attn.k_conv1d.weight, self_attn.v_conv1d.weight -> self_attn.conv1d.weight (Concatenate; not experts)"},
    {"kolibri1", "hf", {{"moe.router.expert_bias", "mlp.gate.e_score_correction_bias"}, {"post_attn_norm", "post_self_attn_layernorm"}, {"post_ffn_norm", "post_mlp_layernorm"}}, ""},
    {"laguna", "hf", {{"mlp.experts.e_score_correction_bias", "mlp.gate.e_score_correction_bias"}, {"mlp.shared_expert.", "mlp.shared_experts."}}, ""},
    {"lara_mini", "stacked", {{"linear_attn.out_norm.", "linear_attn.norm."}}, ""},
    {"lfm2_moe", "hf-w1w3", {}, ""},
    {"llama4", "stacked-transposed", {}, ""},
    {"llama4_text", "stacked-transposed", {}, ""},
    {"longcat_flash", "hf", {}, ""},
    {"mellum", "hf", {}, ""},
    {"mimo_v2_flash", "hf", {{"self_attn.attention_sink_bias", "self_attn.sinks"}}, ""},
    {"minimax", "hf-mixtral", {}, ""},
    {"minimax_m2", "hf-mixtral", {{".block_sparse_moe.e_score_correction_bias", ".mlp.e_score_correction_bias"}}, ""},
    {"minimax_m3_vl", "hf-w1w3", {{"^language_model.lm_head", "lm_head"}, {"^language_model.model.", "model.language_model."}, {"^vision_tower.vision_model.embeddings.patch_embedding.", "model.vision_tower.embeddings.proj."}, {"^vision_tower.vision_model.encoder.layers.", "model.vision_tower.layers."}, {"^vision_tower.vision_model.pre_layrnorm.", "model.vision_tower.pre_layrnorm."}, {"^multi_modal_projector.linear_1.", "model.multi_modal_projector.linear_1."}, {"^multi_modal_projector.linear_2.", "model.multi_modal_projector.linear_2."}, {"^patch_merge_mlp.linear_1.", "model.multi_modal_projector.merge_linear_1."}, {"^patch_merge_mlp.linear_2.", "model.multi_modal_projector.merge_linear_2."}, {".block_sparse_moe.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"}, {".self_attn.index_q_proj.", ".self_attn.indexer.q_proj."}, {".self_attn.index_k_proj.", ".self_attn.indexer.k_proj."}, {".self_attn.index_q_norm.", ".self_attn.indexer.q_norm."}, {".self_attn.index_k_norm.", ".self_attn.indexer.k_norm."}}, "rename \\.block_sparse_moe\\.(experts|gate|shared_experts)\\. -> .mlp.\\1. (a regular expression); .gate_proj.weight, .up_proj.weight -> .gate_up_proj.weight (Concatenate; not experts)"},
    {"minimax_m3_vl_text", "stacked", {}, ""},
    {"mistral4", "stacked", {}, ""},
    {"mistral_large4", "", {}, "its renames are regular expressions (its text model is mistral_large4_text)"},
    {"mistral_large4_text", "hf-w1w3", {{".attention.", ".self_attn."}, {".wq.", ".q_proj."}, {".wkv_a_with_mqa.", ".kv_a_proj_with_mqa."}, {".wkv_b.", ".kv_b_proj."}, {".attention_norm.", ".input_layernorm."}, {".ffn_norm.", ".post_attention_layernorm."}, {".kv_a_norm.", ".kv_a_layernorm."}, {".feed_forward.", ".mlp."}, {".gate.", ".mlp.gate."}, {".experts.", ".mlp.experts."}, {".shared_experts.", ".mlp.shared_experts."}, {".ssmax_scaling.s", ".softmax_scaling.scale"}, {".ssmax_scaling.b", ".softmax_scaling.bias"}}, ""},
    {"mixtral", "hf-mixtral", {}, ""},
    {"muse_spark_text", "stacked", {}, ""},
    {"nemo_speechlm", "", {}, "its renames are regular expressions"},
    {"nemotron_h", "hf-up-down", {{"backbone.", "model."}}, ""},
    {"olmoe", "hf", {}, ""},
    {"openai_privacy_filter", "gpt-oss", {}, ""},
    {"phimoe", "hf-mixtral", {{".gate.weight", ".router.weight"}}, ""},
    {"pi0", "", {}, "its renames are regular expressions"},
    {"qwen2_moe", "hf", {}, ""},
    {"qwen3_5_moe_text", "hf", {}, "^model.language_model.(.+) -> model.\\1 (PrefixChange; not experts)"},
    {"qwen3_moe", "hf", {}, ""},
    {"qwen3_next", "hf", {}, ""},
    {"qwen3_omni_moe", "hf", {}, ""},
    {"qwen3_omni_moe_text", "hf", {}, ""},
    {"qwen3_omni_moe_thinker", "hf", {}, ""},
    {"qwen3_vl_moe", "", {}, "the Hub and v5 forms use the same names, one the transpose of the other (Transpose(1, 2)): only shapes could tell them apart"},
    {"qwen3_vl_moe_text", "stacked", {}, ""},
    {"qwen4_exp_text", "hf", {}, "^model.language_model.(.+) -> model.\\1 (PrefixChange; not experts); ngram_embedding.shard_*.weight -> ngram_embedding.weight (Concatenate; not experts)"},
    {"sarvam_mla", "hf", {}, ""},
    {"sarvam_moe", "hf", {{"^model.word_embeddings.", "model.embed_tokens."}, {".attention.", ".self_attn."}, {".self_attn.dense.", ".self_attn.o_proj."}, {".self_attn.query_layernorm.", ".self_attn.q_norm."}, {".self_attn.key_layernorm.", ".self_attn.k_norm."}, {".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias"}}, "query_key_value -> q_proj, k_proj, v_proj (Split; not experts)"},
    {"solar_open", "hf", {}, ""},
    {"step3p7", "", {}, "its renames are regular expressions"},
    {"zaya", "stacked", {}, ""},
  };
  return families;
}

}  // namespace grouplin
