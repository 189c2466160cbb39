// Small checked readers for HDF5 fixtures in tests (HDF5 C API).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace pt::test {

class H5File {
public:
  explicit H5File(const std::string& path)
      : id_(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {
    if (id_ < 0) throw std::runtime_error("cannot open HDF5 file " + path);
  }
  ~H5File() {
    if (id_ >= 0) H5Fclose(id_);
  }
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  // Dataset as a flat vector of T (converted by HDF5), with its shape.
  template <class T>
  std::vector<T> read(const std::string& name, std::vector<hsize_t>* shape = nullptr) const {
    const hid_t ds = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
    if (ds < 0) throw std::runtime_error("fixture has no dataset " + name);
    const hid_t space = H5Dget_space(ds);
    const int rank = H5Sget_simple_extent_ndims(space);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank > 0 ? rank : 0));
    if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    std::size_t n = 1;
    for (hsize_t d : dims) n *= d;
    std::vector<T> out(n);
    const herr_t err = H5Dread(ds, mem_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
    H5Sclose(space);
    H5Dclose(ds);
    if (err < 0) throw std::runtime_error("cannot read dataset " + name);
    if (shape != nullptr) *shape = dims;
    return out;
  }

  bool has_attr(const std::string& object, const std::string& name) const {
    return H5Aexists_by_name(id_, object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
  }

  double attr(const std::string& object, const std::string& name) const {
    double v = 0.0;
    if (H5Aread_by_name_double(object, name, v) < 0) {
      throw std::runtime_error("fixture has no attribute " + object + "@" + name);
    }
    return v;
  }

private:
  template <class T> static hid_t mem_type() {
    if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
    if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
    if constexpr (std::is_same_v<T, std::int32_t>) return H5T_NATIVE_INT32;
  }
  herr_t H5Aread_by_name_double(const std::string& object, const std::string& name,
                                double& v) const {
    const hid_t a = H5Aopen_by_name(id_, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return -1;
    const herr_t err = H5Aread(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    return err;
  }

  hid_t id_;
};

} // namespace pt::test
