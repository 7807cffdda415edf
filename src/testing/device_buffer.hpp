// Owning device allocation for tests and the benchmark.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace hopattn::testing {

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  void upload(const void* host, size_t bytes) {
    check_cuda(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  void download(void* host, size_t bytes) const {
    check_cuda(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  void fill_bytes(int value) { check_cuda(cudaMemset(data_, value, bytes_), "cudaMemset"); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace hopattn::testing
