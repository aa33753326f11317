#include "hyla/plan/hosts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/plan/plan.h"

namespace hyla {

Network parse_network(const std::string& text, const std::string& option) {
  const size_t comma = text.find(',');
  const auto number = [&](const std::string& part) {
    size_t used = 0;
    double value = NAN;
    try {
      value = std::stod(part, &used);
    } catch (const std::exception&) {
    }
    HYLA_CHECK(used == part.size() && std::isfinite(value) && value >= 0,
               "{} {}: give GBPS,LATENCY_US (e.g. 12.5,5: 100 Gb/s with 5 us a message)", option, text);
    return value;
  };
  HYLA_CHECK(comma != std::string::npos, "{} {}: give GBPS,LATENCY_US (e.g. 12.5,5: 100 Gb/s with 5 us a message)",
             option, text);
  Network n{number(text.substr(0, comma)) * 1e9, number(text.substr(comma + 1)) * 1e-6};
  HYLA_CHECK(n.bandwidth_bytes_per_s > 0, "{} {}: the bandwidth must be > 0", option, text);
  return n;
}

double HostsPlan::step_seconds() const { return std::max(memory_seconds, compute_seconds) + disk_seconds + network_seconds; }

double expected_busiest_host_experts(int64_t experts, int64_t chosen, int64_t hosts) {
  HYLA_CHECK(hosts > 0 && experts % hosts == 0 && chosen >= 0 && chosen <= experts,
             "expected_busiest_host_experts: {} experts over {} hosts, {} chosen", experts, hosts, chosen);
  const int64_t each = experts / hosts;
  // ways[j]: the ways to choose j experts from one host's `each`.
  std::vector<long double> ways(size_t(std::min(each, chosen) + 1));
  for (size_t j = 0; j < ways.size(); ++j) ways[j] = j == 0 ? 1.0L : ways[j - 1] * (each - int64_t(j) + 1) / int64_t(j);
  long double all = 1;  // C(experts, chosen)
  for (int64_t j = 1; j <= chosen; ++j) all = all * (experts - j + 1) / j;
  // E[max] = Σ_m P(max > m); P(max ≤ m) counts the choices with at most m on every host:
  // the coefficient of x^chosen in (Σ_{j ≤ m} ways[j] x^j)^hosts.
  double expected = 0;
  for (int64_t m = 0; m < chosen; ++m) {
    std::vector<long double> poly(size_t(chosen + 1), 0.0L);
    poly[0] = 1;
    for (int64_t h = 0; h < hosts; ++h) {
      std::vector<long double> next(poly.size(), 0.0L);
      for (size_t a = 0; a < poly.size(); ++a)
        if (poly[a] != 0)
          for (size_t j = 0; j < ways.size() && int64_t(j) <= m && a + j < poly.size(); ++j) next[a + j] += poly[a] * ways[j];
      poly.swap(next);
    }
    expected += double(1.0L - poly[size_t(chosen)] / all);
  }
  return expected;
}

HostsPlan plan_hosts(const Plan& p, const HostsOptions& o) {
  const ModelConfig& c = p.config;
  HYLA_CHECK(o.hosts >= 1, "--hosts {}: must be at least 1", o.hosts);
  HYLA_CHECK(c.moe.num_experts % o.hosts == 0, "--hosts {}: the {} routed experts of a layer must split evenly",
             o.hosts, c.moe.num_experts);
  HYLA_CHECK(o.memory_bytes > 0 && o.bandwidth_bytes_per_s > 0 && o.flops > 0,
             "--hosts needs each host's --host-memory, --host-bandwidth and --host-flops (> 0)");
  const double n = double(o.hosts), batch = double(p.options.batch);
  const double d = double(c.hidden_size), layers = double(c.num_hidden_layers);
  const int64_t moe_layers = c.num_hidden_layers - c.moe.first_k_dense_replace;
  const double routed = double(p.params.total[int(Component::RoutedExperts)]);
  const double dense = double(p.params.total_sum()) - routed;
  const double lookup = c.tie_word_embeddings ? 0 : double(c.vocab_size) * d;

  HostsPlan h;
  h.hosts = o.hosts;
  h.dense_bytes = dense * o.dense_weights.bytes_per_value / n;
  h.expert_bytes = routed * o.expert_weights.bytes_per_value / n;
  // Heads split the KDA states; every head reads the whole latent cache, so each host keeps it.
  h.state_bytes = batch * (p.sequence.latent_cache_bytes + p.sequence.fixed_bytes() / n);
  const double usable = kHostUsableFraction * o.memory_bytes;
  h.fits_dense = h.dense_bytes + h.state_bytes <= usable;
  h.resident_expert_share =
      h.expert_bytes > 0 ? std::clamp((usable - h.dense_bytes - h.state_bytes) / h.expert_bytes, 0.0, 1.0) : 1.0;

  // The collectives of one token: the embedding's and two per layer (mixer, FFN) all-reduce a
  // d-wide f32 row; a latent MoE layer adds an all-gather of its latent row and a reduction of the
  // experts' latent outputs (bf16); rank 0 gathers the vocabulary's logits (f32).
  const double w = double(c.moe.latent_dim);
  const double spread = (n - 1) / n;
  const double row_reductions = 1 + 2 * layers, latent_collectives = w > 0 ? 2.0 * double(moe_layers) : 0;
  h.collectives_per_token = o.hosts > 1 ? int64_t(row_reductions + latent_collectives + 1) : 0;
  const double latent_bytes = latent_collectives * spread * 2 * w;
  const double logits_bytes = spread * 4 * double(c.vocab_size);
  h.sent_bytes_per_token = row_reductions * 2 * spread * 4 * d + latent_bytes + logits_bytes;
  const double hops = o.hosts > 1 ? std::ceil(std::log2(n)) : 0;  // recursive doubling: small messages
  const double latency = double(h.collectives_per_token) * hops * o.network.latency_seconds;

  // Decode: the busiest host reads its dense share, its most-chosen experts and the state.
  // Balanced routing: each of t tokens picks k of E experts, so a host's E/N experts see
  // E(1 − (1 − k/E)^t)/N distinct ones on average.
  const double E = double(c.moe.num_experts), k = double(c.moe.num_experts_per_tok);
  const auto touched_per_host = [&](double tokens) { return E * (1 - std::pow(1 - k / E, tokens)) / n; };
  const double expert_params = moe_layers > 0 ? routed / (double(moe_layers) * E) : 0;
  if (moe_layers > 0)
    h.experts_read_per_layer = p.options.batch == 1
                                   ? expected_busiest_host_experts(c.moe.num_experts, c.moe.num_experts_per_tok, o.hosts)
                                   : touched_per_host(batch);
  const double expert_read = double(moe_layers) * h.experts_read_per_layer * expert_params * o.expert_weights.bytes_per_value;
  const double dense_read = (dense - lookup) * o.dense_weights.bytes_per_value / n;
  const double state_read = batch * (p.sequence.latent_cache_bytes + 2 * p.sequence.fixed_bytes() / n);
  h.read_bytes = dense_read + expert_read + state_read;
  h.memory_seconds = h.read_bytes / o.bandwidth_bytes_per_s;
  h.compute_seconds = batch * p.flops.decode() / (n * o.flops);
  const double missed = (1 - h.resident_expert_share) * expert_read;
  h.disk_seconds = missed > 0 ? (o.disk_bandwidth_bytes_per_s > 0 ? missed / o.disk_bandwidth_bytes_per_s : INFINITY) : 0;
  h.network_seconds = o.hosts > 1 ? latency + batch * h.sent_bytes_per_token / o.network.bandwidth_bytes_per_s : 0;

  // Prefill: compute per token, or the weights a chunk reads, whichever is slower; a chunk's
  // collectives carry all its rows at once (their latency shared), and only the last token's
  // logits are gathered.
  const double chunk = double(o.prefill_chunk);
  const double chunk_experts =
      moe_layers > 0 ? double(moe_layers) * touched_per_host(chunk) * expert_params * o.expert_weights.bytes_per_value : 0;
  const double prefill_memory = (dense_read + chunk_experts) / o.bandwidth_bytes_per_s / chunk;
  h.prefill_compute_seconds_per_token = std::max(p.flops.prefill() / (n * o.flops), prefill_memory);
  h.prefill_network_seconds_per_token =
      o.hosts > 1 ? (h.sent_bytes_per_token - logits_bytes) / o.network.bandwidth_bytes_per_s + latency / chunk : 0;
  return h;
}

}  // namespace hyla
