#include "hyla/model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/mxfp4_weights.h"
#include "hyla/model/model.h"

namespace fs = std::filesystem;

namespace hyla {
namespace {

// "kimi-k3, kimi-linear": the llama.cpp architectures hyla reads and writes.
std::string gguf_architecture_names() {
  std::string out;
  for (const Architecture* a : architectures())
    if (!a->gguf_arch.empty()) out += (out.empty() ? "" : ", ") + std::string(a->gguf_arch);
  return out;
}

std::vector<int64_t> without_trailing_ones(std::vector<int64_t> ne) {
  while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
  return ne;
}

// The dtype a tensor of `type` is read as: its own for F32, F16 and BF16 (a view of the file), else
// f32 (dequantised).
DType read_dtype(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    default: return DType::F32;
  }
}

// Values [first, first + shape.numel()) of `t`, as read_dtype(t.type) says.
Tensor slice(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape) {
  const GgmlType type = GgmlType(t.type);
  const uint8_t* p = g.data(t) + ggml_bytes(type, first);
  const bool stored_as_read = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
  const DType dtype = read_dtype(t.type);
  if (stored_as_read && reinterpret_cast<uintptr_t>(p) % dtype_size(dtype) == 0)
    return Tensor::view(dtype, shape, const_cast<uint8_t*>(p), g.mapped(t));
  Tensor out = Tensor::empty(DType::F32, shape);
  g.decode(t, first, shape.numel(), out.data<float>());
  return out;
}

// The int8 codes and f32 scales of Q8_0 rows (hyla's int8 layout with block 32: the same numbers).
Tensor ones(const Shape& shape) {
  Tensor t = Tensor::empty(DType::F32, shape);
  std::fill_n(t.data<float>(), shape.numel(), 1.0f);
  return t;
}

Tensor q8_0_codes(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape) {
  const uint8_t* p = g.data(t) + ggml_bytes(GgmlType::Q8_0, first);
  Tensor out = Tensor::empty(DType::I8, shape);
  for (int64_t b = 0; b < shape.numel() / 32; ++b) std::memcpy(out.data<int8_t>() + b * 32, p + b * 34 + 2, 32);
  return out;
}

Tensor q8_0_scales(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape) {
  const uint8_t* p = g.data(t) + ggml_bytes(GgmlType::Q8_0, first);
  Tensor out = Tensor::empty(DType::F32, shape);
  for (int64_t b = 0; b < shape.numel(); ++b) {
    f16 d;
    std::memcpy(&d, p + b * 34, 2);
    out.data<float>()[b] = to_f32(d);
  }
  return out;
}

// The weights that keep a stored form (Q8_0 as int8 with block 32, MXFP4 as MXFP4, any quantised
// type as its blocks): stored as a type `stored` accepts, allowed it by the model (`allowed`), and
// every weight that runs in the same kernel alike (Param::stored_like_next).
std::set<std::string> kept_as(const GgufFile& g, const ModelConfig& config, const std::vector<GgufTensorMap>& maps,
                              bool (*stored_as)(GgmlType), bool (*allowed)(const Param&)) {
  std::set<std::string> stored;
  for (const GgufTensorMap& m : maps) {
    const GgufTensor* t = g.find(m.gguf);
    if (t && stored_as(GgmlType(t->type)) && (m.link == GgufLink::Same || m.link == GgufLink::Experts))
      stored.insert(m.hyla.begin(), m.hyla.end());
  }
  Model layout(config, /*allocate=*/false);
  const auto& params = layout.params().params();
  std::set<std::string> out;
  for (size_t i = 0; i < params.size();) {
    size_t end = i + 1;
    while (end < params.size() && params[end - 1]->stored_like_next) ++end;
    bool ok = true;
    for (size_t j = i; j < end; ++j) ok &= allowed(*params[j]) && stored.count(params[j]->name) > 0;
    for (size_t j = i; ok && j < end; ++j) out.insert(params[j]->name);
    i = end;
  }
  return out;
}

// The E2M1 codes [rows, cols / 2] and E8M0 scales [rows, cols / 32] of MXFP4 rows (mxfp4_weights.h).
Tensor mxfp4_part(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape, bool scales) {
  const int64_t rows = shape[0], cols = shape[1];
  Tensor codes = Tensor::empty(DType::U8, {rows, cols / 2}), scale = Tensor::empty(DType::U8, {rows, cols / 32});
  mxfp4_blocks_to_codes(g.data(t) + ggml_bytes(GgmlType::MXFP4, first), rows * cols, codes.data<uint8_t>(),
                        scale.data<uint8_t>());
  return scales ? scale : codes;
}

}  // namespace

bool is_gguf_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

const Architecture& gguf_architecture(const ModelConfig& config, const std::string& source) {
  const Architecture& arch = architecture(config.architecture);
  HYLA_CHECK(!arch.gguf_arch.empty(),
             "{}: architecture {} has no llama.cpp GGUF format (the architectures with one: {}); a model of it "
             "whose options fit one of them is written by naming that one (hyla convert --architecture)",
             source, arch.name, gguf_architecture_names());
  check_architecture(config, source);
  return arch;
}

ModelConfig config_from_gguf(const GgufFile& g) {
  const std::string source = g.path().string();
  const std::string name = g.string("general.architecture");
  const Architecture* arch = architecture_of_gguf(name);
  HYLA_CHECK(arch, "{}: architecture '{}'; hyla reads llama.cpp's {} GGUF files", source, name, gguf_architecture_names());
  ModelConfig c = arch->read_gguf(GgufKeys(g, name));
  c.validate(source);
  check_architecture(c, source);
  return c;
}

ModelWeights weights_from_gguf(std::shared_ptr<const GgufFile> gguf, const ModelConfig& config, GgufQuantized quantized) {
  const GgufFile& g = *gguf;
  const std::string source = g.path().string();
  const Architecture& architecture = gguf_architecture(config, source);
  const std::string arch(architecture.gguf_arch);
  HYLA_CHECK(g.string("general.architecture") == arch, "{}: a {} file, but the config is {}", source,
             g.string("general.architecture"), arch);
  ModelWeights w;
  for (const auto& file : g.mapped_files()) w.keep_mapped(file);
  const std::vector<GgufTensorMap> maps = architecture.gguf_tensors(config);
  const auto matrix = [](const Param& p) { return p.int8_allowed; };
  const std::set<std::string> int8 =
      quantized != GgufQuantized::Decoded
          ? kept_as(g, config, maps, [](GgmlType t) { return t == GgmlType::Q8_0; }, matrix)
          : std::set<std::string>{};
  const std::set<std::string> mxfp4 = kept_as(
      g, config, maps, [](GgmlType t) { return t == GgmlType::MXFP4; }, [](const Param& p) { return p.mxfp4_allowed(); });
  std::set<std::string> blocks;
  if (quantized == GgufQuantized::InPlace)
    for (const std::string& name : kept_as(g, config, maps, ggml_type_quantized, matrix))
      if (!int8.count(name) && !mxfp4.count(name)) blocks.insert(name);
  const auto int8_meta = std::make_shared<const std::map<std::string, std::string>>(int8_metadata(32));
  // A Q8_0 matrix kept as int8: its codes and, beside them, its scales.
  auto add_int8 = [&](const std::string& name, const GgufTensor* t, int64_t first, const Shape& shape) {
    const Shape scales{shape[0], shape[1] / 32};
    const MappedBytes bytes{gguf->mapped(*t), gguf->data(*t) + ggml_bytes(GgmlType::Q8_0, first),
                            size_t(ggml_bytes(GgmlType::Q8_0, shape.numel()))};
    w.add({name, DType::I8, shape, 0, uint64_t(shape.numel())}, source,
          [gguf, t, first, shape] { return q8_0_codes(*gguf, *t, first, shape); }, int8_meta, bytes);
    w.add({int8_scale_name(name), DType::F32, scales, 0, uint64_t(scales.numel()) * 2}, source,
          [gguf, t, first, scales] { return q8_0_scales(*gguf, *t, first, scales); }, int8_meta, bytes);
  };
  // An MXFP4 expert matrix kept as MXFP4: its codes and scales.
  auto add_mxfp4 = [&](const std::string& name, const GgufTensor* t, int64_t first, const Shape& shape) {
    const Shape codes{shape[0], shape[1] / 2}, scales{shape[0], shape[1] / 32};
    const MappedBytes bytes{gguf->mapped(*t), gguf->data(*t) + ggml_bytes(GgmlType::MXFP4, first),
                            size_t(ggml_bytes(GgmlType::MXFP4, shape.numel())), GgmlType::MXFP4};
    w.add({name, DType::U8, codes, 0, uint64_t(codes.numel())}, source,
          [gguf, t, first, shape] { return mxfp4_part(*gguf, *t, first, shape, /*scales=*/false); }, nullptr, bytes);
    w.add({mxfp4_scale_name(name), DType::U8, scales, 0, uint64_t(scales.numel())}, source,
          [gguf, t, first, shape] { return mxfp4_part(*gguf, *t, first, shape, /*scales=*/true); }, nullptr, bytes);
  };
  // A matrix kept as its blocks: the rows of blocks as they lie in the map.
  auto add_blocks = [&](const std::string& name, const GgufTensor* t, int64_t first, const Shape& shape) {
    const GgmlType type = GgmlType(t->type);
    const int64_t row_bytes = int64_t(ggml_bytes(type, shape[1]));
    const uint8_t* begin = gguf->data(*t) + ggml_bytes(type, first);
    const MappedBytes bytes{gguf->mapped(*t), begin, size_t(row_bytes * shape[0]), type};
    w.add({name, DType::U8, {shape[0], row_bytes}, 0, uint64_t(row_bytes * shape[0])}, source,
          [gguf, t, begin, rows = shape[0], row_bytes] {
            return Tensor::view(DType::U8, {rows, row_bytes}, const_cast<uint8_t*>(begin), gguf->mapped(*t));
          }, nullptr, bytes);
  };
  std::set<std::string> used;
  auto entry = [](const std::string& name, DType dtype, Shape shape, uint64_t bytes) {
    return SafetensorsEntry{name, dtype, shape, 0, bytes};
  };
  for (const GgufTensorMap& m : maps) {
    const GgufTensor* t = g.find(m.gguf);
    HYLA_CHECK(t, "{}: missing tensor '{}' (for '{}')", source, m.gguf, m.hyla[0]);
    used.insert(m.gguf);
    const bool alternate_a = m.link == GgufLink::NegExp && without_trailing_ones(t->ne) == std::vector<int64_t>{1, m.ne[1]};
    HYLA_CHECK(without_trailing_ones(t->ne) == without_trailing_ones(m.ne) || alternate_a,
               "{}: tensor '{}' has ne [{}] but the config needs [{}]", source, m.gguf, fmt::join(t->ne, ", "),
               fmt::join(m.ne, ", "));
    switch (m.link) {
      case GgufLink::Same: {
        if (config.tie_word_embeddings && m.gguf == "output.weight") break;
        std::vector<int64_t> ne = m.ne;
        if (ne.size() == 4) ne.pop_back();  // the convs: {kernel, 1, H·K, 1} is hyla's [H·K, 1, kernel]
        const Shape shape(ne.rbegin(), ne.rend());
        if (int8.count(m.hyla[0])) {
          add_int8(m.hyla[0], t, 0, shape);
          break;
        }
        if (blocks.count(m.hyla[0])) {
          add_blocks(m.hyla[0], t, 0, shape);
          break;
        }
        const DType dtype = read_dtype(t->type);
        w.add(entry(m.hyla[0], dtype, shape, t->bytes), source, [gguf, t, shape] { return slice(*gguf, *t, 0, shape); });
        break;
      }
      case GgufLink::NegExp:
      case GgufLink::Exp: {
        const Shape shape{config.kda.num_heads};
        const double sign = m.link == GgufLink::NegExp ? -1.0 : 1.0;
        w.add(entry(m.hyla[0], DType::F32, shape, t->bytes), source, [gguf, t, shape, source, sign, name = m.gguf] {
          Tensor a = gguf->to_f32(*t), out = Tensor::empty(DType::F32, shape);
          for (int64_t h = 0; h < shape[0]; ++h) {
            const double x = sign * a.data<float>()[h];
            HYLA_CHECK(x > 0 && std::isfinite(x), "{}: tensor '{}' holds {} at head {}; {}exp(A_log) is {}", source, name,
                       a.data<float>()[h], h, sign < 0 ? "−" : "", sign < 0 ? "negative" : "positive");
            out.data<float>()[h] = float(std::log(x));
          }
          return out;
        });
        break;
      }
      case GgufLink::Experts: {
        const int64_t per = m.ne[0] * m.ne[1];
        const Shape shape{m.ne[1], m.ne[0]};
        const DType dtype = read_dtype(t->type);
        for (size_t e = 0; e < m.hyla.size(); ++e)
          if (int8.count(m.hyla[e])) add_int8(m.hyla[e], t, int64_t(e) * per, shape);
          else if (mxfp4.count(m.hyla[e])) add_mxfp4(m.hyla[e], t, int64_t(e) * per, shape);
          else if (blocks.count(m.hyla[e])) add_blocks(m.hyla[e], t, int64_t(e) * per, shape);
          else w.add(entry(m.hyla[e], dtype, shape, t->bytes / m.hyla.size()), source,
                [gguf, t, shape, first = int64_t(e) * per] { return slice(*gguf, *t, first, shape); });
        break;
      }
      case GgufLink::KeyB: {  // kv_b_proj from attn_k_b and attn_v_b together
        const MlaConfig& mc = config.mla;
        const int64_t H = mc.num_heads, Dn = mc.qk_nope_head_dim, Dv = mc.v_head_dim, c = mc.kv_lora_rank;
        const std::string vname = m.gguf.substr(0, m.gguf.size() - std::string("attn_k_b.weight").size()) + "attn_v_b.weight";
        const GgufTensor* vt = g.find(vname);
        HYLA_CHECK(vt, "{}: missing tensor '{}' (for '{}')", source, vname, m.hyla[0]);
        const Shape shape{H * (Dn + Dv), c};
        w.add(entry(m.hyla[0], DType::F32, shape, t->bytes + vt->bytes), source, [gguf, t, vt, shape, H, Dn, Dv, c] {
          const Tensor kb = gguf->to_f32(*t), vb = gguf->to_f32(*vt);  // [H, c, Dn], [H, Dv, c]
          Tensor out = Tensor::empty(DType::F32, shape);
          float* o = out.data<float>();
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < Dn; ++i)
              for (int64_t j = 0; j < c; ++j) o[(h * (Dn + Dv) + i) * c + j] = kb.data<float>()[(h * c + j) * Dn + i];
            std::memcpy(o + (h * (Dn + Dv) + Dn) * c, vb.data<float>() + h * Dv * c, size_t(Dv * c) * 4);
          }
          return out;
        });
        break;
      }
      case GgufLink::ValueB: break;  // read with attn_k_b
      case GgufLink::Score: {
        const Shape shape{config.hidden_size};
        w.add(entry(m.hyla[0], DType::F32, shape, t->bytes), source, [gguf, t] { return gguf->to_f32(*t); });
        w.add(entry(m.hyla[1], DType::F32, shape, 0), source, [shape] { return ones(shape); });
        break;
      }
    }
  }
  for (const GgufTensor& t : g.tensors())
    HYLA_CHECK(used.count(t.name) || (architecture.gguf_skips && architecture.gguf_skips(config, t.name)), "{}: tensor '{}' is not part of this {} model (its config reads as {} layers, {} experts)",
               source, t.name, arch, config.num_hidden_layers, config.moe.num_experts);
  return w;
}

GgufExport save_gguf(const fs::path& path, const ModelConfig& c, const ModelWeights& weights,
                     const GgufExportOptions& options) {
  const Architecture& architecture = gguf_architecture(c, path.string());
  const std::string arch(architecture.gguf_arch);
  HYLA_CHECK(options.matrices != GgmlType::MXFP4,
             "{}: MXFP4 is written only from MXFP4 experts (hyla quantize --experts mxfp4), which keep it whatever "
             "the type of the other matrices", path.string());
  GgufMetadata meta;
  meta["general.architecture"] = GgufValue::string(arch);
  meta["general.name"] = GgufValue::string(options.name);
  const std::map<GgmlType, int64_t> file_type = {
      {GgmlType::F32, 0}, {GgmlType::F16, 1}, {GgmlType::Q8_0, 7}, {GgmlType::BF16, 32}};
  meta["general.file_type"] = GgufValue::u32(uint32_t(file_type.at(options.matrices)));
  GgufKeyWriter keys(meta, arch);
  architecture.write_gguf(c, keys);
  // Without a vocabulary llama.cpp keeps vocab_size dummy tokens and runs on token ids.
  meta["tokenizer.ggml.model"] = GgufValue::string("none");
  for (const auto& [k, v] : options.tokenizer) meta[k] = v;

  const std::vector<GgufTensorMap> maps = architecture.gguf_tensors(c);
  std::vector<GgufTensor> tensors;
  // MXFP4 experts stay MXFP4 (only bits move): the expert tensors of a layer take their format.
  const auto is_mxfp4 = [&](const GgufTensorMap& mp) {
    return mp.link == GgufLink::Experts && weights.entry(mp.hyla[0]).dtype == DType::U8;
  };
  bool any_mxfp4 = false;
  for (const GgufTensorMap& mp : maps) {
    GgmlType type = mp.matrix ? options.matrices : GgmlType::F32;
    if (mp.ne[0] % ggml_block_values(type) != 0) type = GgmlType::F32;  // Q8_0 needs rows of whole blocks
    if (is_mxfp4(mp)) type = GgmlType::MXFP4, any_mxfp4 = true;
    tensors.push_back({mp.gguf, mp.ne, uint32_t(type), 0, 0});
  }
  // llama.cpp's LLAMA_FTYPE_MOSTLY_MXFP4_MOE (38) names a file whose experts are MXFP4.
  if (any_mxfp4) meta["general.file_type"] = GgufValue::u32(38);
  GgufWriter writer(path, meta, tensors, options.split_max_bytes);
  std::vector<uint8_t> bytes;
  auto write_f32 = [&](const GgufTensor& t, const float* data, int64_t n) {
    bytes.resize(ggml_bytes(GgmlType(t.type), n));
    f32_to_ggml(GgmlType(t.type), data, bytes.data(), n);
    writer.write(bytes.data(), bytes.size());
  };
  auto read_f32 = [&](const std::string& name) {
    HYLA_CHECK(weights.entry(name).dtype != DType::I8 && weights.entry(name).dtype != DType::U8,
               "{}: tensor '{}' is {}; a GGUF is written from floating-point weights (the model before hyla quantize; "
               "MXFP4 experts are the exception, all of a layer's)",
               weights.file_of(name), name, weights.entry(name).dtype == DType::I8 ? "int8" : "MXFP4");
    const Tensor t = weights.get(name);
    return t.dtype() == DType::F32 ? t : t.to(DType::F32);
  };
  for (size_t i = 0; i < maps.size(); ++i) {
    const GgufTensorMap& mp = maps[i];
    const GgufTensor& t = writer.tensors()[i];
    switch (mp.link) {
      case GgufLink::Same: {
        const Tensor x = read_f32(mp.hyla[0]);
        HYLA_CHECK(x.numel() == t.numel(), "'{}' has {} values, '{}' needs {}", mp.hyla[0], x.numel(), t.name, t.numel());
        write_f32(t, x.data<float>(), x.numel());
        break;
      }
      case GgufLink::NegExp:
      case GgufLink::Exp: {
        const Tensor a = read_f32(mp.hyla[0]);
        const double sign = mp.link == GgufLink::NegExp ? -1.0 : 1.0;
        std::vector<float> v(size_t(a.numel()));
        for (size_t h = 0; h < v.size(); ++h) v[h] = float(sign * std::exp(double(a.data<float>()[h])));
        write_f32(t, v.data(), int64_t(v.size()));
        break;
      }
      case GgufLink::Experts:
        for (const std::string& name : mp.hyla) {
          if (GgmlType(t.type) == GgmlType::MXFP4) {
            HYLA_CHECK(weights.entry(name).dtype == DType::U8, "{}: tensor '{}' is {}, but the other experts of '{}' are MXFP4",
                       weights.file_of(name), name, dtype_name(weights.entry(name).dtype), t.name);
            const Tensor codes = weights.get(name), scales = weights.get(mxfp4_scale_name(name));
            const int64_t n = codes.numel() * 2;
            bytes.resize(ggml_bytes(GgmlType::MXFP4, n));
            mxfp4_codes_to_blocks(codes.data<uint8_t>(), scales.data<uint8_t>(), n, bytes.data());
            writer.write(bytes.data(), bytes.size());
            continue;
          }
          const Tensor x = read_f32(name);
          write_f32(t, x.data<float>(), x.numel());
        }
        break;
      case GgufLink::KeyB:
      case GgufLink::ValueB: {
        const MlaConfig& m = c.mla;
        const int64_t H = m.num_heads, Dn = m.qk_nope_head_dim, Dv = m.v_head_dim, cl = m.kv_lora_rank;
        const Tensor kvb = read_f32(mp.hyla[0]);
        const float* x = kvb.data<float>();
        std::vector<float> v(size_t(t.numel()));
        for (int64_t h = 0; h < H; ++h) {
          if (mp.link == GgufLink::KeyB) {
            for (int64_t j = 0; j < cl; ++j)
              for (int64_t n = 0; n < Dn; ++n) v[size_t((h * cl + j) * Dn + n)] = x[(h * (Dn + Dv) + n) * cl + j];
          } else {
            std::memcpy(v.data() + h * Dv * cl, x + (h * (Dn + Dv) + Dn) * cl, size_t(Dv * cl) * 4);
          }
        }
        write_f32(t, v.data(), int64_t(v.size()));
        break;
      }
      case GgufLink::Score: {
        const Tensor q = read_f32(mp.hyla[0]), n = read_f32(mp.hyla[1]);
        std::vector<float> v(size_t(q.numel()));
        for (size_t j = 0; j < v.size(); ++j) v[j] = q.data<float>()[j] * n.data<float>()[j];
        write_f32(t, v.data(), int64_t(v.size()));
        break;
      }
    }
  }
  writer.commit();
  return {arch, writer.paths()};
}

}  // namespace hyla
