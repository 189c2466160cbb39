// The sanitizer build's defaults (PIPETRAIN_SANITIZE), compiled into every executable: leak
// detection off, as the asan preset asks, whatever environment a launcher, a test's script or
// the build (gtest_discover_tests runs the test programs) passes on. The leaks it would report
// are the MPI library's and Kokkos's at exit (Open MPI's op and component selection, hwloc
// bitmaps, Kokkos's initialisation: about 120 kB in 3,400 allocations a rank, none from
// pipetrain's code). ASAN_OPTIONS in the environment still overrides these.
extern "C" const char* __asan_default_options() {
  return "detect_leaks=0:abort_on_error=0";
}
