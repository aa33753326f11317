#include "hyla/model/collective.h"

#include "hyla/model/expert_exchange.h"

namespace hyla {

SingleProcess& single_process() {
  static SingleProcess one;
  return one;
}

LocalExperts& local_experts() {
  static LocalExperts local;
  return local;
}

}  // namespace hyla
