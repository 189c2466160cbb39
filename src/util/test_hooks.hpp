// Test-only switches, set in the environment by tests to provoke what no deck can: a lost
// message, a withheld collective, a kill in the middle of a write, the GPU path's host staging
// on a machine without a GPU, a per-step proof that replicated gradients agree. They are read
// here and nowhere else; none is meant for users (docs/architecture.md lists them).
//   PIPETRAIN_TEST_STAGED=1             host kernels whose memory is treated as a device's: every
//                                       MPI message and reduction is staged through host copies
//   PIPETRAIN_TEST_DROP_SEND=1          pipeline rank 0 skips its first activation send
//   PIPETRAIN_TEST_WITHHOLD_TP=1        tensor-parallel rank 1 never joins its first tp all-reduce
//   PIPETRAIN_TEST_KILL_IN_CHECKPOINT=N the last rank kills itself while writing step N's
//                                       checkpoint
//   PIPETRAIN_TEST_STALL_IN_CHECKPOINT=N the last rank stalls before step N's checkpoint file is
//                                       opened (the others wait in HDF5's collective open)
//   PIPETRAIN_TEST_FAIL_IN_CHECKPOINT=N the kernel refuses the last rank's data writes of step
//                                       N's checkpoint (a file-size limit of 0: EFBIG), as a
//                                       full disk refuses them
//   PIPETRAIN_CHECK_TP_REPLICAS=1       every step, replicated gradients must be bitwise equal on
//                                       every tp rank
//   PIPETRAIN_TEST_BF16_PRODUCTS=1      host kernels whose products round their inputs to bf16
//                                       as a GPU's do: the model's GPU paths at bf16 on the host
//   PIPETRAIN_TEST_QUICK_PEAK=1         the peak rate (MFU's denominator) from a 256^3 product
//                                       for 10 ms instead of 2048^3 for 0.25 s: the test suite
//                                       starts hundreds of runs and reads no MFU
#pragma once

namespace pt {

struct TestHooks {
  bool staged = false;
  bool drop_send = false;
  bool withhold_tp = false;
  int kill_in_checkpoint = -1;  // the step; -1: never
  int stall_in_checkpoint = -1; // the step; -1: never
  int fail_in_checkpoint = -1;  // the step; -1: never
  bool check_tp_replicas = false;
  bool bf16_products = false;
  bool quick_peak = false;
};

// Read from the environment at the first call.
const TestHooks& test_hooks();

} // namespace pt
