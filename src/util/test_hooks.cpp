#include "util/test_hooks.hpp"

#include <cstdlib>
#include <string>

namespace pt {
namespace {

bool is_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

TestHooks read_hooks() {
  TestHooks h;
  h.staged = is_one("PIPETRAIN_TEST_STAGED");
  h.bf16_products = is_one("PIPETRAIN_TEST_BF16_PRODUCTS");
  h.drop_send = is_one("PIPETRAIN_TEST_DROP_SEND");
  h.withhold_tp = is_one("PIPETRAIN_TEST_WITHHOLD_TP");
  h.check_tp_replicas = is_one("PIPETRAIN_CHECK_TP_REPLICAS");
  h.quick_peak = is_one("PIPETRAIN_TEST_QUICK_PEAK");
  if (const char* k = std::getenv("PIPETRAIN_TEST_KILL_IN_CHECKPOINT"))
    h.kill_in_checkpoint = std::atoi(k);
  if (const char* k = std::getenv("PIPETRAIN_TEST_STALL_IN_CHECKPOINT"))
    h.stall_in_checkpoint = std::atoi(k);
  if (const char* k = std::getenv("PIPETRAIN_TEST_FAIL_IN_CHECKPOINT"))
    h.fail_in_checkpoint = std::atoi(k);
  return h;
}

} // namespace

const TestHooks& test_hooks() {
  static const TestHooks hooks = read_hooks();
  return hooks;
}

} // namespace pt
