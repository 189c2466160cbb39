// The HDF5 pieces the checkpoint writer and reader share: an owning handle, scalar attributes
// (read only when they hold exactly one element of bounded size: a damaged file must not overrun
// a buffer or size an allocation), and opening a file for MPI-IO.
#pragma once

#include <hdf5.h>
#include <mpi.h>
#include <sys/resource.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PT_ASAN 1
#endif
#endif

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

namespace pt {

// Owns one HDF5 handle; closes it with the matching H5?close.
class H5 {
public:
  H5() = default;
  H5(hid_t id, herr_t (*closer)(hid_t)) : id_(id), close_(closer) {}
  ~H5() { reset(); }
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  H5(H5&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5& operator=(H5&& o) noexcept {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = -1;
    return *this;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  void reset() { close(); }
  // Closes now (the id is gone even where the close fails); false where it failed (a file's
  // flush to a full disk).
  bool close() {
    const herr_t r = id_ >= 0 && close_ != nullptr ? close_(id_) : 0;
    id_ = -1;
    return r >= 0;
  }

private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

inline H5 string_type(std::size_t len) {
  H5 t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), std::max<std::size_t>(len, 1));
  return t;
}

inline bool write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5 type = string_type(value.size());
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr.ok() && H5Awrite(attr.get(), type.get(), value.c_str()) >= 0;
}

template <class T>
inline bool write_attr(hid_t obj, const char* name, hid_t type, const T* v, hsize_t n) {
  H5 space(n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5 attr(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr.ok() && H5Awrite(attr.get(), type, v) >= 0;
}

// Whether a dataspace holds exactly one element. Reads below fill one value: a damaged file's
// array in its place would overrun it.
inline bool one_element(hid_t space) {
  return space >= 0 && H5Sget_simple_extent_npoints(space) == 1;
}

// One fixed-length string of at most max_bytes (a damaged size must not become an allocation).
inline bool read_string(hid_t obj, hid_t space, hid_t type, std::size_t max_bytes, bool attribute,
                        std::string& out) {
  if (!one_element(space) || H5Tget_class(type) != H5T_STRING) return false;
  const std::size_t size = H5Tget_size(type);
  if (size == 0 || size > max_bytes) return false;
  std::string buf(size, '\0');
  H5 mem = string_type(size);
  const herr_t read = attribute
                          ? H5Aread(obj, mem.get(), buf.data())
                          : H5Dread(obj, mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
  if (read < 0) return false;
  out = buf.c_str();
  return true;
}

inline bool read_string_attr(hid_t obj, const char* name, std::string& out) {
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return false;
  H5 space(H5Aget_space(attr.get()), H5Sclose);
  H5 type(H5Aget_type(attr.get()), H5Tclose);
  return read_string(attr.get(), space.get(), type.get(), 4096, true, out);
}

template <class T> inline bool read_attr(hid_t obj, const char* name, hid_t type, T& out) {
  H5 attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return false;
  H5 space(H5Aget_space(attr.get()), H5Sclose);
  return one_element(space.get()) && H5Aread(attr.get(), type, &out) >= 0;
}

// The process's data segment (VmData of /proc/self/status) in bytes; 0 where it cannot be read.
inline unsigned long long data_segment_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  unsigned long long kib = 0;
  while (kib == 0 && status >> key) {
    if (key == "VmData:") status >> kib;
    status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return kib * 1024;
}

// HDF5 1.10.8 can loop on a damaged group's local heap, allocating without end inside H5Dopen2
// (docs/fuzzing.md). While one lives, the data segment (RLIMIT_DATA) may grow by at most
// `headroom` bytes past its size now: beyond that malloc fails, HDF5 returns an error, and the
// file is refused as damaged instead of filling the node's memory. The previous limit comes back
// when it goes; a lower limit already set, or no /proc/self/status, leaves things as they are.
class DataGrowthLimit {
public:
  explicit DataGrowthLimit(unsigned long long headroom)
      : start_(data_segment_bytes()), headroom_(headroom) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(PT_ASAN) // ASan's own mappings would fail, fatally
    if (start_ == 0 || getrlimit(RLIMIT_DATA, &saved_) != 0) return;
    const rlim_t limit = start_ + headroom;
    if (saved_.rlim_cur != RLIM_INFINITY && saved_.rlim_cur <= limit) return;
    rlimit lower = saved_;
    lower.rlim_cur = limit;
    set_ = setrlimit(RLIMIT_DATA, &lower) == 0;
#endif
  }
  ~DataGrowthLimit() {
    if (set_) setrlimit(RLIMIT_DATA, &saved_);
  }
  DataGrowthLimit(const DataGrowthLimit&) = delete;
  DataGrowthLimit& operator=(const DataGrowthLimit&) = delete;
  // Whether the segment has grown by more than half the headroom: what ran under it hit the limit.
  bool reached() const {
    return set_ && data_segment_bytes() > start_ + headroom_ / 2;
  }

private:
  unsigned long long start_, headroom_;
  rlimit saved_{};
  bool set_ = false;
};

inline H5 open_file(const std::string& path, MPI_Comm comm, bool create) {
  H5 fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  // metadata is written and read collectively: one rank does the I/O, the rest agree
  H5Pset_coll_metadata_write(fapl.get(), 1);
  H5Pset_all_coll_metadata_ops(fapl.get(), 1);
  if (create) return H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  return H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
}

} // namespace pt
