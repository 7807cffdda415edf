// Marks functions shared by host code (validation, tests, CPU reference) and device kernels.
#pragma once

#if defined(__CUDACC__)
#define HOPATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HOPATTN_HOST_DEVICE inline
#endif
