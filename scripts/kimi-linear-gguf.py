#!/usr/bin/env python3
"""Write a random-weight GGUF for llama.cpp arch `kimi-linear` at hyla's configs/small.json shape.

Mirrors what conversion/kimi_linear.py (KimiLinearModel, registered for KimiLinearForCausalLM)
+ conversion/base.py (TextModel.set_gguf_parameters / prepare_tensors) emit with --outtype bf16
for this HF-style config:

  hidden_size 512, num_hidden_layers 8, vocab_size 8192, intermediate_size 1408,
  num_attention_heads 8, num_key_value_heads 8, q_lora_rank null, kv_lora_rank 128,
  qk_nope_head_dim 64, qk_rope_head_dim 0, v_head_dim 64,
  linear_attn_config {full_attn_layers [4, 8], kda_layers [1,2,3,5,6,7], num_heads 8,
                      head_dim 64, short_conv_kernel_size 4},
  num_experts 128, num_experts_per_token 4, num_shared_experts 1, moe_intermediate_size 128,
  first_k_dense_replace 1, routed_scaling_factor 2.5, moe_router_activation_func sigmoid,
  rms_norm_eps 1e-5, rope_theta 10000, max_position_embeddings 1048576, tie_word_embeddings false

Converter transformations reproduced here:
  * A_log -> ssm_a = -exp(A_log), numpy shape (1, 1, H, 1), F32 (name has no .weight suffix)
  * dt_bias -> ssm_dt.bias, F32
  * q/k/v_conv1d [d_inner, d_conv] -> numpy (1, d_inner, 1, d_conv), F32 (forced F32 list)
  * kv_b_proj [H*(nope+v), kv_lora] -> view (H, nope+v, kv_lora), split into
      attn_k_b = k_b.transpose(1, 2) -> numpy (H, kv_lora, nope)
      attn_v_b = v_b                 -> numpy (H, v, kv_lora)
  * experts w1/w2/w3 stacked -> ffn_gate_exps / ffn_down_exps / ffn_up_exps
  * ffn_gate_inp (router) forced F32; 1-D tensors and *_norm.weight F32; rest BF16
  * head_count_kv written as a per-layer array: 0 for KDA layers, 1 for MLA layers (MQA form)

Usage: PYTHONPATH=LLAMA_CPP/gguf-py python3 scripts/kimi-linear-gguf.py OUT.gguf   (numpy: Debian python3-numpy)
"""
import sys
import numpy as np
import gguf

if len(sys.argv) != 2:
    sys.exit("usage: kimi-linear-gguf.py OUT.gguf")
OUT = sys.argv[1]
ARCH = "kimi-linear"

# ---- shape (hyla configs/small.json) ----
n_vocab = 8192
n_embd = 512
n_layer = 8
full_attn_layers = [4, 8]          # 1-based, as in HF linear_attn_config
n_head = 8                         # same for KDA and MLA
kda_head_dim = 64
d_conv = 4
kv_lora_rank = 128
qk_nope = 64
qk_rope = 0                        # NoPE
v_head = 64
n_expert = 128
n_expert_used = 4
n_shared = 1
n_ff_exp = 128
n_ff_dense = 1408
first_k_dense = 1
routed_scale = 2.5
rms_eps = 1e-5
n_ctx_train = 1048576
rope_theta = 10000.0

STD = 0.02
rng = np.random.default_rng(1234)
BF16 = gguf.GGMLQuantizationType.BF16
F32 = gguf.GGMLQuantizationType.F32

w = gguf.GGUFWriter(OUT, ARCH)

# ---- general metadata (prepare_metadata) ----
w.add_type(gguf.GGUFType.MODEL)
w.add_name("Kimi Linear Small Random")
w.add_size_label("small")

# ---- TextModel.set_gguf_parameters (base) ----
w.add_block_count(n_layer)
w.add_context_length(n_ctx_train)
w.add_embedding_length(n_embd)
w.add_feed_forward_length(n_ff_dense)
w.add_head_count(n_head)
# (base writes head_count_kv=1 here; KimiLinear overwrites it with the per-layer array below)
w.add_rope_freq_base(rope_theta)
w.add_layer_norm_rms_eps(rms_eps)
w.add_expert_count(n_expert)
w.add_expert_used_count(n_expert_used)
w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

# ---- KimiLinearModel.set_gguf_parameters ----
w.add_vocab_size(n_vocab)
head_count_kv = [1 if (il + 1) in full_attn_layers else 0 for il in range(n_layer)]
w.add_head_count_kv(head_count_kv)
w.add_ssm_conv_kernel(d_conv)
w.add_kda_head_dim(kda_head_dim)
# q_lora_rank is null -> not written
w.add_kv_lora_rank(kv_lora_rank)
w.add_rope_dimension_count(qk_rope)
w.add_key_length(kv_lora_rank + qk_rope)
w.add_key_length_mla(qk_nope + qk_rope)
w.add_value_length_mla(v_head)
w.add_expert_feed_forward_length(n_ff_exp)
w.add_expert_shared_count(n_shared)
w.add_leading_dense_block_count(first_k_dense)
w.add_expert_weights_scale(routed_scale)

# ---- vocab: byte-level gpt2 BPE, 256 byte tokens + pair merges + 1 control token ----
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))

b2u = bytes_to_unicode()
byte_toks = [b2u[b] for b in range(256)]
tokens = list(byte_toks)
merges = []
order = [b2u[b] for b in list(range(97, 123)) + list(range(65, 91)) + [32] + list(range(48, 58))]  # letters, space, digits first
order += [c for c in byte_toks if c not in order]
n_pairs = n_vocab - 256 - 1
done = False
for a in order:
    for b in order:
        if len(tokens) - 256 >= n_pairs:
            done = True
            break
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    if done:
        break
tokens.append("<|endoftext|>")
assert len(tokens) == n_vocab and len(set(tokens)) == n_vocab
toktypes = [gguf.TokenType.NORMAL] * (n_vocab - 1) + [gguf.TokenType.CONTROL]
eot = n_vocab - 1

w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("default")
w.add_token_list(tokens)
w.add_token_types(toktypes)
w.add_token_merges(merges)
w.add_bos_token_id(eot)
w.add_eos_token_id(eot)
w.add_add_bos_token(False)

# ---- tensors ----
n_params = 0

def add(name, arr, force_f32=False):
    """Apply base.prepare_tensors dtype rules: F32 for 1-D, *_norm.weight, forced list, non-.weight names."""
    global n_params
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    n_params += arr.size
    f32 = force_f32 or arr.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
    if f32:
        w.add_tensor(name, arr, raw_dtype=F32)
    else:
        w.add_tensor(name, gguf.quants.quantize(arr, BF16), raw_dtype=BF16)

def randn(*shape):
    return (rng.standard_normal(shape, dtype=np.float32) * STD)

def ones(*shape):
    return np.ones(shape, dtype=np.float32)

add("token_embd.weight", randn(n_vocab, n_embd))

d_inner = n_head * kda_head_dim
for il in range(n_layer):
    p = f"blk.{il}."
    add(p + "attn_norm.weight", ones(n_embd))
    if (il + 1) not in full_attn_layers:
        # ---- KDA ----
        add(p + "attn_q.weight", randn(d_inner, n_embd))
        add(p + "attn_k.weight", randn(d_inner, n_embd))
        add(p + "attn_v.weight", randn(d_inner, n_embd))
        for c in "qkv":  # HF [d_inner, d_conv] -> numpy (1, d_inner, 1, d_conv); forced F32
            add(p + f"ssm_conv1d_{c}.weight", randn(d_inner, d_conv).reshape(1, d_inner, 1, d_conv), force_f32=True)
        add(p + "ssm_f_a.weight", randn(kda_head_dim, n_embd))
        add(p + "ssm_f_b.weight", randn(d_inner, kda_head_dim))
        add(p + "ssm_beta.weight", randn(n_head, n_embd))
        A_log = np.log(rng.uniform(1.0, 16.0, size=(1, 1, n_head, 1))).astype(np.float32)
        add(p + "ssm_a", -np.exp(A_log))                       # converter: A_log -> -exp(A_log)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), size=(d_inner,)))
        dt_bias = dt + np.log(-np.expm1(-dt))                  # inverse softplus
        add(p + "ssm_dt.bias", dt_bias.astype(np.float32))     # converter: dt_bias -> ssm_dt.bias
        add(p + "ssm_g_a.weight", randn(kda_head_dim, n_embd))
        add(p + "ssm_g_b.weight", randn(d_inner, kda_head_dim))
        add(p + "ssm_norm.weight", ones(kda_head_dim))
        add(p + "attn_output.weight", randn(n_embd, d_inner))
    else:
        # ---- MLA (q_lora_rank null -> plain q_proj) ----
        add(p + "attn_q.weight", randn(n_head * (qk_nope + qk_rope), n_embd))
        add(p + "attn_kv_a_mqa.weight", randn(kv_lora_rank + qk_rope, n_embd))
        add(p + "attn_kv_a_norm.weight", ones(kv_lora_rank))
        kv_b = randn(n_head * (qk_nope + v_head), kv_lora_rank).reshape(n_head, qk_nope + v_head, kv_lora_rank)
        k_b = kv_b[:, :qk_nope, :].transpose(0, 2, 1)          # (H, kv_lora, nope)
        v_b = kv_b[:, qk_nope:, :]                             # (H, v, kv_lora)
        add(p + "attn_k_b.weight", k_b)
        add(p + "attn_v_b.weight", v_b)
        add(p + "attn_output.weight", randn(n_embd, n_head * v_head))
    add(p + "ffn_norm.weight", ones(n_embd))
    if il < first_k_dense:
        add(p + "ffn_gate.weight", randn(n_ff_dense, n_embd))
        add(p + "ffn_up.weight", randn(n_ff_dense, n_embd))
        add(p + "ffn_down.weight", randn(n_embd, n_ff_dense))
    else:
        add(p + "ffn_gate_inp.weight", randn(n_expert, n_embd), force_f32=True)
        add(p + "exp_probs_b.bias", np.zeros(n_expert, dtype=np.float32))  # e_score_correction_bias
        add(p + "ffn_gate_exps.weight", randn(n_expert, n_ff_exp, n_embd))
        add(p + "ffn_up_exps.weight", randn(n_expert, n_ff_exp, n_embd))
        add(p + "ffn_down_exps.weight", randn(n_expert, n_embd, n_ff_exp))
        n_ff_sh = n_ff_exp * n_shared
        add(p + "ffn_gate_shexp.weight", randn(n_ff_sh, n_embd))
        add(p + "ffn_up_shexp.weight", randn(n_ff_sh, n_embd))
        add(p + "ffn_down_shexp.weight", randn(n_embd, n_ff_sh))

add("output_norm.weight", ones(n_embd))
add("output.weight", randn(n_vocab, n_embd))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

# active params per token: routed experts count n_expert_used of n_expert
moe_layers = n_layer - first_k_dense
exp_total = moe_layers * 3 * n_expert * n_ff_exp * n_embd
exp_active = moe_layers * 3 * n_expert_used * n_ff_exp * n_embd
print(f"wrote {OUT}")
print(f"total params {n_params} ({n_params/1e6:.2f} M); active/token {n_params - exp_total + exp_active} "
      f"({(n_params - exp_total + exp_active)/1e6:.2f} M); non-embedding total {n_params - 2*n_vocab*n_embd}")
