# A tiny hyla model directory written as a Hugging Face checkpoint in the release's layout: the
# released config.json (tests/data) shrunk to the model's shape, the tensors renamed and reshaped as
# the release stores them, f32 (MXFP4 experts as compressed-tensors packs with MXFP4=1). A model with
# a MoonViT tower gets its vision_config and preprocessor_config.json, and the tower's tensors under
# their checkpoint names (hyla keeps those; the patch convolution goes back to [D, 3, P, P]).
# Ling 3.0 (ARCH ling3) has no released config.json here: its config is written with the keys
# llama.cpp's converter (conversion/bailingmoe3.py and its base) reads, and its tensors under the
# names that converter maps (model.word_embeddings, attention.*, attention.dense for MLA's output,
# mlp.gate.expert_bias).
#   python3 scripts/hf-checkpoint.py MODEL_DIR OUT_DIR REPO ARCH [MXFP4]      ARCH: kimi-k3 | kimi-linear | ling3
import json, struct, sys
import numpy as np
src, dst, repo, arch = sys.argv[1:5]
mxfp4 = len(sys.argv) > 5 and sys.argv[5]
k3 = arch == 'kimi-k3'
ling3 = arch == 'ling3'
tiny = json.load(open(f'{src}/config.json'))
if ling3:
    mla_layers = [l for l, x in enumerate(tiny['layer_types']) if x == 'mla']
    group = mla_layers[0] + 1
    assert all(((l + 1) % group == 0) == (x == 'mla') for l, x in enumerate(tiny['layer_types'])), 'every group-th layer MLA'
    m, k, f = tiny['mla'], tiny['kda'], tiny['moe']
    moe_layer = [l >= f['first_k_dense_replace'] for l in range(tiny['num_hidden_layers'])]
    hf = dict(architectures=['BailingMoeV3ForCausalLM'], model_type='bailing_moe_v3', torch_dtype='float32',
              vocab_size=tiny['vocab_size'], hidden_size=tiny['hidden_size'], num_hidden_layers=tiny['num_hidden_layers'],
              num_attention_heads=m['num_heads'], num_key_value_heads=m['num_heads'], head_dim=k['head_dim'],
              intermediate_size=f['intermediate_size'], rms_norm_eps=tiny['rms_norm_eps'], rope_theta=m['rope_theta'],
              max_position_embeddings=tiny['max_position_embeddings'], tie_word_embeddings=tiny['tie_word_embeddings'],
              hidden_act='silu', layer_group_size=group, short_conv_kernel_size=k['conv_kernel'],
              kda_lower_bound=k['gate_lower_bound'], kda_safe_gate=True, no_kda_lora=True,
              gated_attention_proj_granularity_type='head_wise', q_lora_rank=m['q_lora_rank'] or None,
              kv_lora_rank=m['kv_lora_rank'], qk_nope_head_dim=m['qk_nope_head_dim'],
              qk_rope_head_dim=m['qk_rope_head_dim'], v_head_dim=m['v_head_dim'], num_experts=f['num_experts'],
              num_experts_per_tok=f['num_experts_per_tok'], num_shared_experts=f['num_shared_experts'],
              moe_intermediate_size=f['moe_intermediate_size'],
              moe_shared_expert_intermediate_size=f.get('shared_intermediate_size') or f['num_shared_experts'] * f['moe_intermediate_size'],
              first_k_dense_replace=f['first_k_dense_replace'], routed_scaling_factor=f['routed_scaling_factor'],
              norm_topk_prob=True, score_function='sigmoid', num_nextn_predict_layers=0,
              expert_swiglu_limit_list=[f.get('swiglu_limit', 0) if x else None for x in moe_layer],
              share_expert_swiglu_limit_list=[f.get('shared_swiglu_limit', 0) if x else None for x in moe_layer])
    json.dump(hf, open(f'{dst}/config.json', 'w'), indent=1)
else:
    # The released config.json, shrunk to the tiny config's shape.
    hf = json.load(open(f"{repo}/tests/data/{'kimi-k3-hf-config.json' if k3 else 'kimi-linear-48b-a3b-hf-config.json'}"))
    t = hf['text_config'] if k3 else hf
    t.update(vocab_size=tiny['vocab_size'], hidden_size=tiny['hidden_size'], intermediate_size=tiny['moe']['intermediate_size'],
             num_hidden_layers=tiny['num_hidden_layers'], num_attention_heads=tiny['mla']['num_heads'],
             num_key_value_heads=tiny['mla']['num_heads'], kv_lora_rank=tiny['mla']['kv_lora_rank'],
             qk_nope_head_dim=tiny['mla']['qk_nope_head_dim'], qk_rope_head_dim=tiny['mla']['qk_rope_head_dim'],
             v_head_dim=tiny['mla']['v_head_dim'], moe_intermediate_size=tiny['moe']['moe_intermediate_size'],
             num_experts=tiny['moe']['num_experts'], num_experts_per_token=tiny['moe']['num_experts_per_tok'],
             num_shared_experts=tiny['moe']['num_shared_experts'], first_k_dense_replace=tiny['moe']['first_k_dense_replace'],
             routed_scaling_factor=tiny['moe']['routed_scaling_factor'], rms_norm_eps=tiny['rms_norm_eps'],
             max_position_embeddings=tiny['max_position_embeddings'])
    if k3:
        t.update(q_lora_rank=tiny['mla']['q_lora_rank'] or None, routed_expert_hidden_size=tiny['moe']['latent_dim'],
                 attn_res_block_size=tiny['attn_res']['block_size'], activation_situ_beta=tiny['moe']['situ_beta'],
                 activation_situ_linear_beta=tiny['moe']['situ_linear_beta'])
    full = [l + 1 for l, x in enumerate(tiny['layer_types']) if x == 'mla']
    t['linear_attn_config'].update(full_attn_layers=full, kda_layers=[l + 1 for l in range(tiny['num_hidden_layers']) if l + 1 not in full],
                                   num_heads=tiny['kda']['num_heads'], head_dim=tiny['kda']['head_dim'])
    if mxfp4:  # the release's routed experts: compressed-tensors MXFP4
        hf['quantization_config'] = {'quant_method': 'compressed-tensors', 'format': 'mxfp4-pack-quantized'}
    vision = tiny.get('vision', {})
    if vision.get('enabled') and vision.get('tower') == 'moonvit':
        v = vision['moonvit']
        hf['vision_config'].update(
            patch_size=vision['patch_size'], vt_hidden_size=v['hidden_size'], mm_hidden_size=v['hidden_size'],
            vt_num_attention_heads=v['num_heads'], qkv_hidden_size=v['num_heads'] * v['head_dim'],
            vt_num_hidden_layers=v['num_layers'], vt_intermediate_size=v['intermediate_size'],
            init_pos_emb_height=v['pos_emb_height'], init_pos_emb_width=v['pos_emb_width'],
            merge_kernel_size=[v['merge'], v['merge']], pos_emb_interpolation_mode=v['pos_emb_resample'],
            norm_type=v['norm'], attn_bias=v['bias'], linear_bias=v['bias'],
            patch_embed_proj_bias=v['bias'], mm_projector_type=v['projector'], projector_ln_eps=v['projector_eps'],
            projector_hidden_act='gelu' if v['projector_gelu'] == 'erf' else 'gelu_pytorch_tanh',
            text_hidden_size=tiny['hidden_size'])
        json.dump({'media_proc_cfg': {'in_patch_limit': v['in_patch_limit'], 'patch_limit_on_one_side': v['patch_limit_on_one_side'],
                                      'patch_size': vision['patch_size'], 'merge_kernel_size': v['merge'],
                                      'image_mean': v['image_mean'], 'image_std': v['image_std']}},
                  open(f'{dst}/preprocessor_config.json', 'w'), indent=1)
    else:
        hf.pop('vision_config', None)  # text only, as llama.cpp's K3 converter reads it
    json.dump(hf, open(f'{dst}/config.json', 'w'), indent=1)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
def pack_mxfp4(w):  # the OCP recipe: scale 2^(floor(log2 max) - 2) per 32, nearest E2M1 code
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=2)
    e = np.clip(np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-38))) - 2, 0) + 127, 1, 254)
    v = blocks / np.exp2(e - 127)[:, :, None]
    code = np.abs(np.abs(v)[..., None] - E2M1).argmin(axis=3) | np.where(v < 0, 8, 0)
    code = code.reshape(rows, cols).astype(np.uint8)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8), e.astype(np.uint8)
# The tensors under the release's names and shapes.
b = open(f'{src}/model.safetensors', 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
renames = [('.mlp.gate.', '.block_sparse_moe.gate.'), ('.mlp.shared_experts.', '.block_sparse_moe.shared_experts.'),
           ('.mlp.lat_down.', '.block_sparse_moe.routed_expert_down_proj.'),
           ('.mlp.lat_up.', '.block_sparse_moe.routed_expert_up_proj.'),
           ('.mlp.lat_norm.', '.block_sparse_moe.routed_expert_norm.'),
           ('.attn_res_query', '.self_attention_res_proj.weight'), ('.attn_res_norm.', '.self_attention_res_norm.'),
           ('.mlp_res_query', '.mlp_res_proj.weight'), ('model.out_res_query', 'model.output_attn_res_proj.weight'),
           ('model.out_res_norm.', 'model.output_attn_res_norm.')]
out = {}
for name, e in header.items():
    if name == '__metadata__':
        continue
    s, e2 = e['data_offsets']
    x = np.frombuffer(b[8 + n + s:8 + n + e2], dtype=np.float32).reshape(e['shape'])
    if name.startswith(('vision_tower.', 'mm_projector.')):
        if name == 'vision_tower.patch_embed.proj.weight':
            x = x.reshape(x.shape[0], 3, vision['patch_size'], vision['patch_size'])
        out[name] = np.ascontiguousarray(x)
        continue
    if ling3:
        hname = name.replace('model.embed_tokens.', 'model.word_embeddings.').replace('.self_attn.', '.attention.')
        hname = hname.replace('.mlp.gate.e_score_correction_bias', '.mlp.gate.expert_bias')
        layer = int(name.split('.')[2]) if name.startswith('model.layers.') else -1
        if layer >= 0 and tiny['layer_types'][layer] == 'mla' and hname.endswith('.attention.o_proj.weight'):
            hname = hname.replace('.attention.o_proj.', '.attention.dense.')
        out[hname] = np.ascontiguousarray(x)
        continue
    hname = name
    for a, c in renames:
        hname = hname.replace(a, c)
    if '.mlp.experts.' in hname:
        hname = hname.replace('.mlp.experts.', '.block_sparse_moe.experts.')
        hname = hname.replace('.gate_proj.', '.w1.').replace('.down_proj.', '.w2.').replace('.up_proj.', '.w3.')
        if mxfp4:
            codes, scales = pack_mxfp4(x)
            out[('language_model.' if k3 else '') + hname + '_packed'] = codes
            out[('language_model.' if k3 else '') + hname + '_scale'] = scales
            continue
    if hname.endswith('A_log'):
        x = x.reshape(-1) if k3 else x.reshape(1, 1, -1, 1)
    if hname.endswith('conv1d.weight'):
        x = x.reshape(x.shape[0], x.shape[2])
    if hname.endswith('res_proj.weight'):
        x = x.reshape(1, -1)
    out[('language_model.' if k3 else '') + hname] = np.ascontiguousarray(x)
h, offset = {}, 0
for name, x in out.items():
    h[name] = {'dtype': 'U8' if x.dtype == np.uint8 else 'F32', 'shape': list(x.shape), 'data_offsets': [offset, offset + x.nbytes]}
    offset += x.nbytes
text = json.dumps(h).encode()
text += b' ' * ((8 - len(text) % 8) % 8)
with open(f'{dst}/model.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text)
    for x in out.values():
        f.write(x.tobytes())
