#pragma once
// `hyla plan --dp N --ep N`: the communication of training on a data- × expert-parallel layout
// against the step's compute (formulas in docs/plan.md "Communication of training"). Every GPU trains on its
// own tokens; a group of EP GPUs holds one copy of the routed experts (E / EP each), DP such groups
// make the job, and every GPU holds every other parameter. Tensor and pipeline parallelism are not
// modelled (TP = PP = 1). GPUs reach each other over NVLink inside a domain (an HGX board, an
// NVL72 rack) and over the scale-out fabric (one NIC per GPU) beyond it.
#include <cstdint>
#include <string>
#include <vector>

namespace hyla {

struct Plan;

// One GPU's link: bandwidth in one direction, and the latency of one step of a collective.
struct Fabric {
  std::string name;
  double bandwidth_bytes_per_s = 0;
  double latency_seconds = 0;
};

// A name from the table (nvlink4, nvlink5, ib-ndr400, ib-hdr200, roce-400) or
// `custom:GBps[,latency_us]`; anything else is a one-line hyla::Error naming `option`.
Fabric parse_fabric(const std::string& text, const std::string& option);
const std::vector<Fabric>& known_fabrics();

// The expert all-to-all moves bf16 activations and their bf16 gradients (hyla's in-process
// exchange moves f32 rows; a GPU build would not); the data-parallel reduction moves f32 gradients
// (and, under ZeRO-1, f32 weights), as hyla's GradientReducer does with its flat f32 buffers.
constexpr double kAllToAllBytesPerValue = 2;
constexpr double kGradientBytesPerValue = 4;

struct CommOptions {
  int64_t dp = 1;  // expert replicas: groups of EP GPUs
  int64_t ep = 1;  // GPUs the routed experts are spread over
  Fabric scale_out = parse_fabric("ib-ndr400", "--fabric");
  Fabric nvlink = parse_fabric("nvlink4", "--nvlink");
  int64_t nvlink_domain = 8;       // GPUs that reach each other over NVLink
  double batch_tokens = 16777216;  // all GPUs' tokens per optimiser step (4,096 sequences of 4,096)
  double target_share = 0.15;      // of the step, for the bandwidth it needs
  int64_t gpus() const { return dp * ep; }
};

// What one collective costs each GPU in one optimiser step, by the link it crosses.
struct LinkTraffic {
  double nvlink_bytes = 0, scale_out_bytes = 0;  // each GPU sends (and receives as many)
  double nvlink_steps = 0, scale_out_steps = 0;  // steps of the algorithm, each paying its link's latency
  double bytes() const { return nvlink_bytes + scale_out_bytes; }
  double latency_seconds(const Fabric& nvlink, const Fabric& scale_out) const;
  // The two links' parts one after the other (conservative: overlapping them saves at most the
  // shorter part).
  double seconds(const Fabric& nvlink, const Fabric& scale_out) const;
  LinkTraffic& operator+=(const LinkTraffic& other);
};

struct Communication {
  int64_t gpus = 1;
  double tokens_per_gpu = 0;  // per optimiser step
  // Sequences of train_seq_len per GPU per step: the all-to-alls run once per micro-batch and MoE
  // layer, so their latency counts these.
  int64_t micro_batches = 0;
  int64_t expert_width = 0;  // the width of the rows that cross: hidden_size, or moe.latent_dim
  double all_to_all_bytes_per_token_layer = 0;  // dispatch + combine of one token's k rows, forward
  LinkTraffic all_to_all;                        // every MoE layer, forward and backward
  int64_t replicated_params = 0;                 // all but the routed experts: on every GPU
  int64_t expert_params_per_gpu = 0;             // its E / EP experts of every MoE layer
  LinkTraffic replicated_gradients;              // reduced over all DP · EP GPUs
  LinkTraffic expert_gradients;                  // reduced over the DP GPUs that hold the same experts
  double state_bytes_per_gpu = 0;                // ZeRO-1 model states
  double compute_seconds = 0;                    // the GPU's share of the step's FLOPs at the MFU
  double all_to_all_seconds = 0, gradient_seconds = 0;
  double latency_seconds = 0;  // the part of both that is every collective's steps' latency
  // The bandwidth per GPU that keeps communication at the target share of the step without
  // overlap, of the scale-out fabric (of NVLink when no traffic leaves a domain); 0 when nothing is
  // communicated, infinite when latency and the other link alone take more than the target allows.
  double needed_bandwidth_bytes_per_s = 0;
  bool needed_on_nvlink = false;

  double gradient_bytes() const { return replicated_gradients.bytes() + expert_gradients.bytes(); }
  double comm_seconds() const { return all_to_all_seconds + gradient_seconds; }
  double step_seconds_no_overlap() const { return compute_seconds + comm_seconds(); }
  double step_seconds_full_overlap() const;
  double share_no_overlap() const { return comm_seconds() / step_seconds_no_overlap(); }
  // Communication that full overlap cannot hide: the part longer than compute, over the step.
  double exposed_share_full_overlap() const;
  bool communication_bound() const { return comm_seconds() > compute_seconds; }
};

// Defined when options.comm is set; fails with a one-line hyla::Error naming the option that is
// out of range.
Communication plan_communication(const Plan& plan);

}  // namespace hyla
