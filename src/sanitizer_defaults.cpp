// The sanitizer build's defaults (PIPETRAIN_SANITIZE): leak detection off, as the asan preset
// asks, whatever environment a launcher or a test's script passes on. The leaks it would report
// are the MPI library's and Kokkos's at exit (Open MPI's op and component selection, hwloc
// bitmaps, Kokkos's initialisation: about 120 kB in 3,400 allocations a rank, none from
// pipetrain's code). ASAN_OPTIONS in the environment still overrides these.
extern "C" const char* __asan_default_options() {
  return "detect_leaks=0:abort_on_error=0";
}
