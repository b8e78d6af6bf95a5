# Installation and the CMake package. `cmake --install <build> --prefix P` puts into P:
#   include/zero/<folder>/...        the public headers of every installed library
#   lib/libzero_*.a                  the libraries
#   bin/                             zerorun, zero-train, the tools, the benchmarks
#   lib/cmake/zero/                  zeroConfig.cmake and the exported targets
# so a user's project says find_package(zero CONFIG REQUIRED) and links zero::zero (every
# library), or one of zero::kernels, zero::collectives, zero::optimizer, zero::runtime, ...
#
# Included last from the top-level CMakeLists.txt, once every target exists. The folders keep
# writing plain `target_include_directories(... PUBLIC <dir>/include)`; this file turns those
# build-tree paths into install-tree ones for the exported copies.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# What gets installed, in one place. A name without a target in this build (zero_kernels_cuda
# without CUDA, say) is skipped, so optional parts join by being listed here.
set(ZERO_INSTALL_LIBRARIES zero_core zero_kernels zero_kernels_cuda zero_collectives zero_optimizer
    zero_config_proto zero_runtime)
set(ZERO_INSTALL_PROGRAMS zerorun zero-train zero-estimate zero-checkpoint zero-tokenize
    zero-bench-optimizer zero-bench-collectives)

# Imported targets without a namespace that a component's own find_dependency provides
# (LibTorch's target is plain `torch`; the torch component below finds it).
set(ZERO_COMPONENT_IMPORTED_TARGETS torch)

# find_dependency() lines for the imported targets our libraries link, by namespace. A
# namespace missing here stops the configure step: a package that cannot find its own
# dependencies fails only later, in the user's project.
set(ZERO_DEPENDENCY_Threads "find_dependency(Threads)")
# Our libraries call MPI's C API through MPI::MPI_C, but FindMPI looks for the C bindings only
# in projects that enable C. A C++-only project finds MPI for C++, whose target carries the same
# MPI library, and MPI::MPI_C becomes a name for it.
set(ZERO_DEPENDENCY_MPI [[
get_property(zero_enabled_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
if("C" IN_LIST zero_enabled_languages)
  find_dependency(MPI COMPONENTS C)
else()
  find_dependency(MPI COMPONENTS CXX)
  if(NOT TARGET MPI::MPI_C)
    add_library(MPI::MPI_C INTERFACE IMPORTED)
    set_target_properties(MPI::MPI_C PROPERTIES INTERFACE_LINK_LIBRARIES MPI::MPI_CXX)
  endif()
endif()
unset(zero_enabled_languages)]])
set(ZERO_DEPENDENCY_protobuf "find_dependency(Protobuf)")
set(ZERO_DEPENDENCY_nlohmann_json "find_dependency(nlohmann_json)")
set(ZERO_DEPENDENCY_BLAS "find_dependency(BLAS)")
# oneDNN and OpenMP: the bf16 products, where the build found them (kernels/CMakeLists.txt).
set(ZERO_DEPENDENCY_DNNL "find_dependency(dnnl CONFIG)")
set(ZERO_DEPENDENCY_OpenMP "find_dependency(OpenMP)")
set(ZERO_DEPENDENCY_CUDA "find_dependency(CUDAToolkit)")
set(ZERO_DEPENDENCY_NCCL "find_dependency(NCCL)")
# The order the lines run in: FindNCCL looks in the CUDA toolkit found before it.
set(ZERO_DEPENDENCY_ORDER Threads MPI protobuf nlohmann_json BLAS DNNL OpenMP CUDA NCCL)

set(ZERO_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/zero)

# The targets among the names after `out` that this build has (the optional parts may be
# off), in `out`.
function(zero_existing_targets out)
  set(found)
  foreach(name IN LISTS ARGN)
    if(TARGET ${name})
      list(APPEND found ${name})
    endif()
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()
zero_existing_targets(zero_libraries ${ZERO_INSTALL_LIBRARIES})
zero_existing_targets(zero_programs ${ZERO_INSTALL_PROGRAMS})

# Prepares one library for export:
# - include directories: the build-tree paths become BUILD_INTERFACE, the installed include/
#   directory INSTALL_INTERFACE, and the headers under them are installed;
# - link interface: an INTERFACE target of ours that is not installed (zero_warnings, which a
#   static library's PRIVATE link leaves behind as $<LINK_ONLY:...>) is kept for the build tree
#   only; any other target of ours that is not installed is an error;
# - the namespaces of imported targets it links are collected for the find_dependency lines.
function(zero_prepare_export library)
  foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES)
    get_target_property(directories ${library} ${property})
    if(NOT directories)
      continue()
    endif()
    set(exported)
    foreach(directory IN LISTS directories)
      if(directory MATCHES "^\\$<BUILD_INTERFACE:(.*)>$")
        set(directory "${CMAKE_MATCH_1}")
      elseif(directory MATCHES "^\\$<")
        list(APPEND exported "${directory}")  # already says where it applies
        continue()
      endif()
      list(APPEND exported "$<BUILD_INTERFACE:${directory}>")
      if(property STREQUAL "INTERFACE_INCLUDE_DIRECTORIES")
        install(DIRECTORY ${directory}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
                FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh" PATTERN "CMakeFiles" EXCLUDE)
      endif()
    endforeach()
    # A user's compiler sees an imported target's headers as system headers anyway, so only the
    # plain include list names the installed directory.
    if(property STREQUAL "INTERFACE_INCLUDE_DIRECTORIES")
      list(APPEND exported "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
    endif()
    set_target_properties(${library} PROPERTIES ${property} "${exported}")
  endforeach()

  get_target_property(links ${library} INTERFACE_LINK_LIBRARIES)
  if(links)
    set(exported)
    foreach(link IN LISTS links)
      set(target "${link}")
      if(link MATCHES "^\\$<LINK_ONLY:([^$<>]+)>$")
        set(target "${CMAKE_MATCH_1}")
      endif()
      if(target IN_LIST ZERO_COMPONENT_IMPORTED_TARGETS)
        list(APPEND exported "${link}")
        continue()
      endif()
      if(TARGET ${target} AND NOT target MATCHES "::" AND NOT target IN_LIST zero_libraries)
        get_target_property(type ${target} TYPE)
        if(NOT type STREQUAL "INTERFACE_LIBRARY")
          message(FATAL_ERROR "${library} links ${target}, which is not installed: add it to "
                              "ZERO_INSTALL_LIBRARIES in cmake/ZeroInstall.cmake")
        endif()
        set(link "$<BUILD_INTERFACE:${link}>")
      endif()
      list(APPEND exported "${link}")
    endforeach()
    set_target_properties(${library} PROPERTIES INTERFACE_LINK_LIBRARIES "${exported}")

    string(REGEX MATCHALL "[A-Za-z0-9_]+::" namespaces "${links}")
    set(needed ${ZERO_NEEDED_NAMESPACES})
    foreach(namespace IN LISTS namespaces)
      string(REPLACE "::" "" namespace "${namespace}")
      if(namespace STREQUAL "zero")
        continue()
      endif()
      if(NOT DEFINED ZERO_DEPENDENCY_${namespace})
        message(FATAL_ERROR "${library} links a target of ${namespace}::, which the package "
                            "cannot find for its users: add ZERO_DEPENDENCY_${namespace} to "
                            "cmake/ZeroInstall.cmake and its name to ZERO_DEPENDENCY_ORDER")
      endif()
      list(APPEND needed ${namespace})
    endforeach()
    set(ZERO_NEEDED_NAMESPACES ${needed} PARENT_SCOPE)
  endif()
  # Installed names drop our prefix: zero_kernels becomes zero::kernels, as in the build tree.
  string(REGEX REPLACE "^zero_" "" export_name ${library})
  set_target_properties(${library} PROPERTIES EXPORT_NAME ${export_name})
  # A sanitizer build's libraries need the sanitizer runtime wherever they are linked.
  if(ZERO_SANITIZE_FLAGS)
    target_link_options(${library} INTERFACE "$<INSTALL_INTERFACE:${ZERO_SANITIZE_FLAGS}>")
  endif()
endfunction()

set(ZERO_NEEDED_NAMESPACES)
foreach(library IN LISTS zero_libraries)
  zero_prepare_export(${library})
endforeach()

# zero::zero: every installed library in one name, the one a user links.
add_library(zero_all INTERFACE)
target_link_libraries(zero_all INTERFACE ${zero_libraries})
set_target_properties(zero_all PROPERTIES EXPORT_NAME zero)
add_library(zero::zero ALIAS zero_all)

install(TARGETS ${zero_libraries} zero_all EXPORT zeroTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${zero_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT zeroTargets NAMESPACE zero:: DESTINATION ${ZERO_CMAKE_DIR})

# The optional LibTorch adapter (zero_torch, built when CMake found Torch) is the package's
# `torch` component: zero::torch in an export set of its own, zeroTorchTargets.cmake, which
# zeroConfig.cmake loads only when a project asks for the component (find_package(zero
# COMPONENTS torch)), so the package works for projects without LibTorch. It finds Torch through
# the user's Torch_DIR or else where this build found it. ZERO_TORCH_DIR_HINT stays empty
# without the adapter, which is how zeroConfig.cmake knows it was not built.
set(ZERO_TORCH_DIR_HINT "")
if(TARGET zero_torch)
  zero_prepare_export(zero_torch)
  install(TARGETS zero_torch EXPORT zeroTorchTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT zeroTorchTargets NAMESPACE zero:: DESTINATION ${ZERO_CMAKE_DIR})
  set(ZERO_TORCH_DIR_HINT "${Torch_DIR}")
endif()

# The find_dependency lines zeroConfig.cmake runs before it loads the targets, once each.
set(ZERO_FIND_DEPENDENCIES)
foreach(namespace IN LISTS ZERO_DEPENDENCY_ORDER)
  if(namespace IN_LIST ZERO_NEEDED_NAMESPACES)
    string(APPEND ZERO_FIND_DEPENDENCIES "${ZERO_DEPENDENCY_${namespace}}\n")
  endif()
endforeach()
# FindNCCL.cmake is ours, not CMake's: it travels with the package.
if("NCCL" IN_LIST ZERO_NEEDED_NAMESPACES)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake DESTINATION ${ZERO_CMAKE_DIR})
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/zeroConfig.cmake
                              INSTALL_DESTINATION ${ZERO_CMAKE_DIR})
# 0.x: only the same minor version promises the same API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroConfig.cmake ${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
        DESTINATION ${ZERO_CMAKE_DIR})
