"""bench/hf_zoo_families.py: the Mixture-of-Experts families bench/hf_zoo_check.py builds, and how.

TINY holds the tiny sizes every family's config gets where it has the field, FAMILIES each
model_type with the config fields it needs beyond them, NOT_BUILT the types with experts that the
check leaves out and why; tiny_config and model_class make a family's config and pick its class.
"""

# Tiny sizes, set on a family's config only where its default config has the field. The sizes
# differ from each other (hidden 32, expert intermediate 24 so gate_up has 48 rows, dense
# intermediate 40, vocab 96) so that no transposed or mis-split tensor has a plausible shape.
TINY = dict(
    vocab_size=96, hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    max_position_embeddings=128, tie_word_embeddings=False,
    # experts: 4 routed, 2 per token, one group, one shared expert
    num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4,
    num_experts_per_tok=2, num_experts_per_token=2, moe_topk=2, moe_k=2,
    n_group=1, topk_group=1, num_expert_group=1,
    n_shared_experts=1, num_shared_experts=1, moe_num_shared_experts=1,
    shared_expert_intermediate_size=24, moe_shared_expert_intermediate_size=24,
    shared_intermediate_size=24,
    # which layers are MoE: layer 0 dense where the family has dense layers, layer 1 MoE
    first_k_dense_replace=1, decoder_sparse_step=1, mlp_only_layers=[],
    # multi-head latent attention, sparse-attention indexers, linear attention, sliding windows
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, qk_head_dim=16,
    v_head_dim=8, index_head_dim=8, index_n_heads=2, index_topk=8,
    linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_conv_kernel_dim=4, linear_head_dim=8, linear_num_heads=4,
    sliding_window=16, num_nextn_predict_layers=0,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)

# model_type -> config fields beyond TINY (always set). Every type of transformers 5.25 whose
# Hub checkpoints hold experts as module lists it merges on load (MergeModulelist on `experts.*`
# in conversion_mapping.py) or whose model holds stacked experts, and that builds on a CPU;
# text models only (the text tower of a multimodal family where it has a model_type of its own).
FAMILIES = {
    # stacked on the Hub already (no per-expert form)
    "llama4_text": dict(intermediate_size_mlp=40, interleave_moe_layer_step=1,
                        no_rope_layers=[1, 1]),
    "gpt_oss": {},
    "openai_privacy_filter": {},
    "granitemoe": {},
    "granitemoeshared": {},
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"],
                             mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
                             mamba_chunk_size=16),
    "granitemoe_swa": {},
    "dbrx": dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=128,
                 attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                 ffn_config={"ffn_hidden_size": 40, "moe_num_experts": 4, "moe_top_k": 2}),
    "jetmoe": dict(kv_channels=8, num_key_value_heads=4),
    "qwen3_vl_moe_text": {},
    "gemma4_text": dict(enable_moe_block=True, top_k_experts=2, vocab_size_per_layer_input=96,
                        hidden_size_per_layer_input=8),
    "dots3_note_text": dict(per_layer_config={"1": dict(  # its sliding layer's own sizes
        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16,
        head_dim=16, qk_nope_head_dim=8, v_head_dim=8, qk_rope_head_dim=8)}),
    "aria_text": {},
    "ergo": dict(first_dense_intermediate_size=40),
    # Mixtral pattern: w1/w3/w2 (under block_sparse_moe, renamed mlp)
    "mixtral": {},
    "minimax": dict(layer_types=["linear_attention", "full_attention"]),
    "minimax_m2": {},
    "phimoe": {},
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    # Qwen2-MoE pattern: gate_proj/up_proj/down_proj under mlp.experts (or feed_forward, mixer)
    "qwen2_moe": {},
    "minicpm5_moe": {},
    "qwen3_moe": {},
    "qwen3_next": {},
    "qwen3_5_moe_text": {},
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=1,
                  expert_layer_offset=0, mamba_dt_rank=8, mamba_d_state=8),
    "nemotron_h": {},
    "olmoe": {},
    "flex_olmo": {},
    "ernie4_5_moe": {},
    "deepseek_v2": {},
    "deepseek_v3": {},
    "deepseek_v32": {},
    "deepseek_v4": {},
    "dots1": {},
    "glm4_moe": {},
    "glm4_moe_lite": {},
    "glm_moe_dsa": {},
    "hunyuan_v1_moe": {},
    "exaone_moe": {},
    "cohere2_moe": {},
    # zero_expert_num=0: transformers gives gate_up_proj a slice for each zero (identity)
    # expert too, unused, but not down_proj: its Hub save then has gate/up for more experts
    # than down, unlike LongCat's real checkpoints (routed experts only)
    "longcat_flash": dict(num_layers=2, ffn_hidden_size=40, expert_ffn_hidden_size=24,
                          zero_expert_num=0, num_key_value_heads=4),
    "afmoe": {},
    "solar_open": {},
    "mellum": {},
    "beam": {},
    "sarvam_moe": {},
    "sarvam_mla": {},
    "param2moe": {},
    "bailing_hybrid": {},
    "kimi_linear": {},
    "kolibri1": {},
    "kolibri1_1": dict(head_dim=16, index_num_heads=2),  # NVFP4 keys need head_dim 16s
    "mimo_v2_flash": {},
    "flint": {},
    "hy_v3": {},
    "hy_v4": {},
    "laguna": {},
    "lara_mini": {},
    "axk1": {},
    "axk2": {},
    "mistral4": dict(head_dim=16),
    "mistral_large4_text": {},
    "minimax_m3_vl_text": {},
    "inkling_text": {},
    "inkling2_text": dict(unpadded_vocab_size=96),
    "inkling2_loop_text": dict(unpadded_vocab_size=96),
    "muse_spark_text": dict(moe_hidden_size=40),
    "zaya": dict(num_experts_per_tok=1, router_hidden_size=16),
    "qwen4_exp_text": dict(layer_types=["linear_attention", "indexed_attention"],
                           indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8,
                           indexer_budget=8, indexer_compress_ratio=2, hc_count=2,
                           hc_lowrank=8),
}

# Types with experts that this check does not build, and why.
NOT_BUILT = {
    "switch_transformers": "encoder-decoder; experts a ModuleDict of dense layers "
                           "(experts.expert_0.wi), no stacked form, no conversion mapping",
    "nllb_moe": "encoder-decoder; experts a ModuleDict of dense layers, no stacked form",
    "glm4v_moe_text": "the tiny config fails validation (mrope_section must sum to the rotary "
                      "half-dim); the composite glm4v_moe needs a vision tower",
    "glm5_next_text": "the tiny config fails validation (mrope_section)",
    "hy_v4_vl_text": "the tiny config fails validation (mrope_section vs qk_rope_head_dim)",
    "ernie4_5_vl_moe_text": "no AutoModel class for the text config (only inside the composite)",
    "qwen3_omni_moe_text": "no AutoModel class for the text config (only inside the composite)",
    "deepseek_ocr2_text": "no AutoModel class for the text config (only inside the composite)",
    "unlimited_ocr_text": "no AutoModel class for the text config (only inside the composite)",
    "step3p5": "no AutoModel class for step3p7's text config (only inside the composite)",
    "diffusion_gemma_text": "no AutoModel class for the text config (only inside the composite)",
    "multimodal composites": "aria, glm4v_moe, qwen3_vl_moe, qwen3_omni_moe, llama4, "
                             "qwen3_5_moe, gemma4, minimax_m3_vl, muse_spark, mistral_large4, "
                             "dots3_note, inkling_mm_model, inkling2, inkling2_loop, glm5_next, "
                             "qwen4_exp, hy_v4_vl, ernie4_5_vl_moe, deepseek_ocr2, "
                             "unlimited_ocr, step3p7, kimi_k25: need vision/audio towers; their "
                             "text towers are checked where they have a model class "
                             "(aria_text, qwen3_vl_moe_text, llama4_text, ...), but a tower's "
                             "own model_type may lack the composite's conversion mapping",
}


def tiny_config(model_type):
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    defaults = CONFIG_MAPPING[model_type]().to_dict()
    kw = {k: v for k, v in TINY.items() if k in defaults}
    if "kv_lora_rank" in defaults:  # multi-head latent attention has no grouped KV heads
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
    n = kw.get("num_hidden_layers", 2)
    for field in ("layer_types", "mlp_layer_types"):
        types = defaults.get(field)
        if isinstance(types, list) and types:  # each kind of layer once: hybrids keep both
            kinds = list(dict.fromkeys(types))
            if field == "layer_types":
                n = max(n, len(kinds))
                kw["num_hidden_layers"] = n
            kw[field] = (kinds * n)[:n]
    kw.update(FAMILIES.get(model_type, {}))
    return AutoConfig.for_model(model_type, **kw)


def model_class(model_type):
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return AutoModelForCausalLM if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModel
