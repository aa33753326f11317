#include "hyla/model/collective.h"

namespace hyla {

SingleProcess& single_process() {
  static SingleProcess one;
  return one;
}

}  // namespace hyla
