#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/tokenizer.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"
#include "hyla/io/gguf.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/model.h"
#include "hyla/model/model_files.h"
#include "hyla/model/param_count.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/model/weight_values.h"

namespace hyla::cli {
namespace fs = std::filesystem;

namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string human_count(double n) {
  if (n >= 1e12) return fmt::format("{:.2f}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{}", int64_t(n));
}

void print_config(const ModelConfig& c) {
  int64_t kda = 0, mla = 0, swa = 0;
  for (LayerType t : c.layer_types) (t == LayerType::Kda ? kda : t == LayerType::Mla ? mla : swa)++;
  fmt::print("architecture: {}\n", c.architecture);
  fmt::print("config: d={} layers={} (kda {}, mla {}, swa {}) vocab={} tied={} max_pos={}\n", c.hidden_size,
             c.num_hidden_layers, kda, mla, swa, c.vocab_size, c.tie_word_embeddings, c.max_position_embeddings);
  fmt::print("  kda: heads={} head_dim={} conv={} gate={} lb={} chunk={}\n", c.kda.num_heads, c.kda.head_dim,
             c.kda.conv_kernel, to_string(c.kda.gate), c.kda.gate_lower_bound, c.kda.chunk_size);
  fmt::print("  mla: heads={} q_lora={} kv_lora={} nope={} rope={} v={} gate={} window={}\n", c.mla.num_heads,
             c.mla.q_lora_rank, c.mla.kv_lora_rank, c.mla.qk_nope_head_dim, c.mla.qk_rope_head_dim, c.mla.v_head_dim,
             c.mla.output_gate, c.mla.sliding_window);
  fmt::print("  moe: experts={} top-k={} shared={} width={} dense layers={} (width {}) router_latent={} latent={} "
             "act={} balancing={}\n",
             c.moe.num_experts, c.moe.num_experts_per_tok, c.moe.num_shared_experts, c.moe.moe_intermediate_size,
             c.moe.first_k_dense_replace, c.moe.intermediate_size, c.moe.router_latent_dim, c.moe.latent_dim,
             to_string(c.moe.activation), to_string(c.moe.balancing));
  const MoonVitConfig& m = c.vision.moonvit;
  const std::string vision =
      !c.vision.enabled ? "off"
      : c.vision.tower == VisionTower::MoonVit
          ? fmt::format("moonvit patch {} width {} heads {}x{} blocks {} mlp {} grid {}x{} ({}) norm {} merge {} "
                        "projector {}",
                        c.vision.patch_size, m.hidden_size, m.num_heads, m.head_dim, m.num_layers, m.intermediate_size,
                        m.pos_emb_height, m.pos_emb_width, to_string(m.pos_emb_resample), to_string(m.norm), m.merge,
                        to_string(m.projector))
          : fmt::format("patch {} channels {} grid {}", c.vision.patch_size, c.vision.channels, c.vision.max_grid);
  fmt::print("  attn_res: {} (block {})  vision: {}\n", c.attn_res.enabled ? "on" : "off", c.attn_res.block_size,
             vision);
}

// A GGUF's (or split set's) own tensors: ggml type, shape as stored, bytes, shard; and bytes per type.
void print_gguf_tensors(const fs::path& path) {
  const GgufFile gguf(path);
  fmt::print("{}{}\n", gguf.path().string(),
             gguf.shard_count() > 1 ? fmt::format(": a split set of {} shards", gguf.shard_count()) : "");
  fmt::print("\n{:<44} {:>7} {:>24} {:>12} {:>5}\n", "GGUF tensor", "type", "ne", "bytes", "shard");
  std::map<std::string, std::pair<int64_t, uint64_t>> per_type;  // tensors, bytes
  for (const GgufTensor& t : gguf.tensors()) {
    const std::string type = ggml_type_name(t.type);
    fmt::print("{:<44} {:>7} {:>24} {:>12} {:>5}\n", t.name, type, fmt::format("[{}]", fmt::join(t.ne, ", ")), t.bytes,
               t.shard + 1);
    per_type[type].first += 1, per_type[type].second += t.bytes;
  }
  for (const auto& [type, n] : per_type)
    fmt::print("  {:<8} {:>6} tensors {:>12}\n", type, n.first, human_bytes(double(n.second)));
  fmt::print("\n");
}

void inspect(const fs::path& dir) {
  // Quantised GGUF tensors as their blocks, as the loading commands read them: their values are
  // checked where they lie (their scales), not decoded.
  const ModelFiles files = open_model_files(dir, {.gguf_quantized = GgufQuantized::InPlace});
  const ModelConfig& config = files.config;
  const ModelWeights& weights = *files.weights;
  if (files.format == ModelFiles::Format::Gguf) {
    print_gguf_tensors(dir);
    fmt::print("llama.cpp GGUF, architecture {}, read as hyla's tensors:\n", gguf_architecture(config, dir.string()).gguf_arch);
  }
  if (files.format == ModelFiles::Format::HuggingFace) fmt::print("Hugging Face checkpoint, read as hyla's tensors:\n");
  print_config(config);

  fmt::print("\n{:<60} {:>5} {:>18} {:>12}\n", "tensor", "dtype", "shape", "bytes");
  uint64_t total_bytes = 0, total_elements = 0;
  std::map<DType, int64_t> per_dtype;
  std::vector<std::string> invalid;  // every tensor's verdict, as the other commands reach the first
  double check_seconds = 0;
  for (const std::string& name : weights.names()) {
    const SafetensorsEntry& e = weights.entry(name);
    fmt::print("{:<60} {:>5} {:>18} {:>12}\n", name, dtype_name(e.dtype), e.shape.str(), e.end - e.begin);
    const auto start = std::chrono::steady_clock::now();
    try {
      check_weight_values(weights, name);
    } catch (const Error& error) {
      invalid.push_back(error.what());
    }
    check_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total_bytes += e.end - e.begin;
    total_elements += uint64_t(e.shape.numel());
    per_dtype[e.dtype] += e.shape.numel();
  }
  fmt::print("\n{} tensors in {} file(s), {} elements, {}; values read and checked in {:.2f} s ({}/s)\n",
             weights.names().size(), weights.file_count(), total_elements, human_bytes(double(total_bytes)),
             check_seconds, human_bytes(double(total_bytes) / std::max(check_seconds, 1e-9)));
  HYLA_CHECK(invalid.empty(), "{}: invalid weights ({} tensors): {}", dir.string(), invalid.size(), fmt::join(invalid, "; "));

  // The weights must be exactly the tensors this config's model creates (int8 ones with their
  // scales, docs/quantization.md).
  Model expected(config, /*allocate=*/false);
  expected.params().plan_storage(weights, dir.string());
  int64_t int8_tensors = 0, int8_elements = 0, block = 0, mxfp4_tensors = 0, mxfp4_elements = 0;
  for (const auto& p : expected.params().params()) {
    if (p->is_int8()) ++int8_tensors, int8_elements += p->numel(), block = p->int8_block;
    if (p->is_mxfp4()) ++mxfp4_tensors, mxfp4_elements += p->numel();
  }
  if (int8_tensors)
    fmt::print("int8: {} matrix-product weights ({} elements) with one F32 scale per {} inputs\n", int8_tensors,
               int8_elements, block);
  if (mxfp4_tensors)
    fmt::print("mxfp4: {} routed-expert matrices ({} elements), E2M1 codes with one E8M0 scale per 32 inputs\n",
               mxfp4_tensors, mxfp4_elements);

  const ParamCounts counts = count_parameters(config);
  fmt::print("\n{:<18} {:>16} {:>16}\n", "component", "total", "active/token");
  for (int c = 0; c < kNumComponents; ++c)
    if (counts.total[c])
      fmt::print("{:<18} {:>16} {:>16}\n", component_name(Component(c)), counts.total[c], counts.active[c]);
  fmt::print("{:<18} {:>16} {:>16}   ({} total, {} active)\n", "sum", counts.total_sum(), counts.active_sum(),
             human_count(double(counts.total_sum())), human_count(double(counts.active_sum())));
  const fs::path tokenizer_path = dir / "tokenizer.json";
  if (const std::optional<Tokenizer> tokenizer = find_model_tokenizer(dir)) {
    fmt::print("tokenizer: {} tokens\n", tokenizer->vocab_size());
  } else if (files.format == ModelFiles::Format::Gguf) {
    fmt::print("tokenizer: none in the GGUF file (commands run on token ids, e.g. hyla logits --tokens)\n");
  } else {
    fmt::print("tokenizer: none (generate, chat and serve need {})\n", tokenizer_path.string());
  }
  fmt::print("ok: weights match config.json, all values valid (finite, scales in range)\n");
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Validate a model directory or GGUF file and print its config, tensors and parameter counts");
  static std::string dir;
  cmd->add_option("dir", dir, "Model directory (config.json + model.safetensors) or GGUF file")->required();
  cmd->callback([] { inspect(dir); });
}

}  // namespace hyla::cli
