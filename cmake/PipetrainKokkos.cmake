# Finds Kokkos and repairs Debian's libtrilinos-kokkos-dev, whose exported Kokkos::kokkos target
# names an include directory that does not exist (/usr/lib/include). A normal Kokkos install
# (Spack, source build) has a correct target and is left untouched.
# Search order: -DKokkos_ROOT / Kokkos_DIR (a site's Kokkos), then the threaded one that
# tools/setup-kokkos builds, then the system's (Debian's is Serial only).
find_package(Kokkos REQUIRED HINTS /opt/pipetrain/kokkos)
# The host backend decides whether a rank can run threads (docs/architecture.md)
set(PT_KOKKOS_THREADED OFF)
if("OPENMP" IN_LIST Kokkos_DEVICES OR "THREADS" IN_LIST Kokkos_DEVICES
   OR "PTHREAD" IN_LIST Kokkos_DEVICES)
  set(PT_KOKKOS_THREADED ON)
  message(STATUS "Kokkos ${Kokkos_VERSION} (${Kokkos_DIR}): host backends ${Kokkos_DEVICES}: "
                 "threads per rank (device.threads) available")
else()
  message(WARNING "Kokkos ${Kokkos_VERSION} (${Kokkos_DIR}) has no threaded host backend "
                  "(${Kokkos_DEVICES}): every rank will run one thread. tools/setup-kokkos "
                  "builds one with OpenMP; or configure with -DKokkos_ROOT=DIR")
endif()

get_target_property(_pt_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
set(_pt_kokkos_fixed "")
foreach(_dir IN LISTS _pt_kokkos_inc)
  if(_dir MATCHES "^\\$<" OR EXISTS "${_dir}")
    list(APPEND _pt_kokkos_fixed "${_dir}")
  endif()
endforeach()
if(NOT _pt_kokkos_fixed)
  find_path(PT_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
    HINTS /usr/include/trilinos ${Kokkos_DIR}/../../../include/trilinos
    DOC "directory holding Kokkos_Core.hpp")
  if(NOT PT_KOKKOS_INCLUDE_DIR)
    message(FATAL_ERROR "Kokkos was found but Kokkos_Core.hpp was not; set PT_KOKKOS_INCLUDE_DIR")
  endif()
  message(STATUS "Kokkos: repairing include directory -> ${PT_KOKKOS_INCLUDE_DIR}")
  set(_pt_kokkos_fixed "${PT_KOKKOS_INCLUDE_DIR}")
endif()
set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_pt_kokkos_fixed}")
unset(_pt_kokkos_inc)
unset(_pt_kokkos_fixed)
