# FindNCCL: locates NVIDIA's collective communication library.
#
# Looks in $NCCL_HOME (or -DNCCL_HOME=...), the CUDA toolkit, /usr/local and the system
# directories. Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the imported
# target NCCL::NCCL (include directory and shared library; link CUDA::cudart beside it).

set(_nccl_roots)
foreach(_root IN ITEMS "${NCCL_HOME}" "$ENV{NCCL_HOME}" "${CUDAToolkit_LIBRARY_ROOT}"
                       "${CUDAToolkit_TARGET_DIR}" /usr/local/cuda /usr/local /usr)
  if(_root)
    list(APPEND _nccl_roots "${_root}")
  endif()
endforeach()

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_roots} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${_nccl_roots} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

# The version, read from the header, so a mismatch with the library shows up in the log.
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" _nccl_${_part}
           "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
