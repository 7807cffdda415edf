# Which head dims and dtypes get specialised kernel instantiations. Compile time grows with each,
# so CI builds a reduced set. Defaults can also come from the environment variables of the same
# names (CI sets them and then runs the README's test command unchanged).
set(_all_headdims 64 96 128 192 256)
set(_all_dtypes fp16 bf16)

set(_default_headdims ${_all_headdims})
if(DEFINED ENV{HOPATTN_HEADDIMS})
  set(_default_headdims $ENV{HOPATTN_HEADDIMS})
endif()
set(_default_dtypes ${_all_dtypes})
if(DEFINED ENV{HOPATTN_DTYPES})
  set(_default_dtypes $ENV{HOPATTN_DTYPES})
endif()

set(HOPATTN_HEADDIMS "${_default_headdims}" CACHE STRING "Head dims to build kernels for (subset of ${_all_headdims})")
# A kernel-set switch, ON by default, also from the environment variable of the same name;
# NAME_CXX is its value as a C++ bool for the generated build_config.hpp.
function(hopattn_kernel_switch name doc)
  set(_default ON)
  if(DEFINED ENV{${name}})
    set(_default $ENV{${name}})
  endif()
  option(${name} "${doc}" ${_default})
  if(${name})
    set(${name}_CXX true PARENT_SCOPE)
  else()
    set(${name}_CXX false PARENT_SCOPE)
  endif()
endfunction()
# Score variants (src/kernels/common/score_variant.hpp) beyond the plain scores: each one is
# another forward and backward kernel per (dtype, head dim).
hopattn_kernel_switch(HOPATTN_SOFTCAP "Build the softcap kernels (ForwardArgs::softcap > 0)")
# The FP8 (e4m3) forward kernels, one per head dim (forward only, plain scores; docs/semantics.md).
hopattn_kernel_switch(HOPATTN_FP8 "Build the FP8 (e4m3) forward kernels")
set(HOPATTN_DTYPES "${_default_dtypes}" CACHE STRING "Dtypes to build kernels for (subset of ${_all_dtypes})")

foreach(_d IN LISTS HOPATTN_HEADDIMS)
  if(NOT _d IN_LIST _all_headdims)
    message(FATAL_ERROR "HOPATTN_HEADDIMS: ${_d} is not one of ${_all_headdims}")
  endif()
endforeach()
foreach(_t IN LISTS HOPATTN_DTYPES)
  if(NOT _t IN_LIST _all_dtypes)
    message(FATAL_ERROR "HOPATTN_DTYPES: ${_t} is not one of ${_all_dtypes}")
  endif()
endforeach()
if(NOT HOPATTN_HEADDIMS OR NOT HOPATTN_DTYPES)
  message(FATAL_ERROR "HOPATTN_HEADDIMS and HOPATTN_DTYPES must each name at least one value")
endif()

# Kernels whose V has a head dim of its own, as QKxV: each is built where its Q/K head dim is
# (other pairs run on the smallest kernel that holds both head dims).
set(_all_headdim_pairs 192x128)
set(HOPATTN_HEADDIM_PAIRS "")
foreach(_pair IN LISTS _all_headdim_pairs)
  string(REGEX MATCH "^[0-9]+" _qk "${_pair}")
  if(_qk IN_LIST HOPATTN_HEADDIMS)
    list(APPEND HOPATTN_HEADDIM_PAIRS ${_pair})
  endif()
endforeach()
# Every kernel's (Q/K, V) head dims, for build_config.hpp: {d, d} per head dim, then the pairs.
set(_pairs_cxx "")
foreach(_d IN LISTS HOPATTN_HEADDIMS)
  list(APPEND _pairs_cxx "{${_d}, ${_d}}")
endforeach()
foreach(_pair IN LISTS HOPATTN_HEADDIM_PAIRS)
  string(REPLACE "x" ", " _pair "${_pair}")
  list(APPEND _pairs_cxx "{${_pair}}")
endforeach()
list(JOIN _pairs_cxx ", " HOPATTN_KERNEL_HEAD_DIMS_CXX)

list(JOIN HOPATTN_HEADDIMS ", " HOPATTN_HEADDIMS_CSV)
set(_enums "")
foreach(_t IN LISTS HOPATTN_DTYPES)
  if(_t STREQUAL "fp16")
    list(APPEND _enums "DType::kFloat16")
  else()
    list(APPEND _enums "DType::kBFloat16")
  endif()
endforeach()
list(JOIN _enums ", " HOPATTN_DTYPES_ENUMS)
message(STATUS "hopattn kernels: head dims {${HOPATTN_HEADDIMS_CSV}} and pairs {${HOPATTN_HEADDIM_PAIRS}}, dtypes {${HOPATTN_DTYPES}}")
