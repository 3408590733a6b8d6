# `cmake --install build --prefix P`: the headers, the libraries, the tools and
# a package config, so that a downstream project writes
#   find_package(zerocpp REQUIRED)
#   target_link_libraries(app PRIVATE zerocpp::zerocpp)
# zerocpp::zerocpp is the engine, the models, the data tools and the
# communicators (MPI; NCCL and the CUDA blocks when built with CUDA). The
# config finds what they need again (LibTorch where this build found it,
# MPI, nlohmann_json, Highway, CUDA/NCCL): README "Using zerocpp in your project".
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(zerocpp INTERFACE)
target_link_libraries(zerocpp INTERFACE zero_engine zero_models zero_data zero_launch)
add_library(zerocpp::zerocpp ALIAS zerocpp)

set(_zero_install_libs zero_core zero_memory zero_offload zero_ckpt zero_comm zero_comm_mpi zero_config zero_optim
    zero_unit zero_engine zero_models zero_data zero_launch zerocpp)
if(TARGET zero_cuda)
  list(APPEND _zero_install_libs zero_cuda)
endif()
install(TARGETS ${_zero_install_libs} EXPORT zerocppTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zero DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/zero/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zero)
foreach(_tool zero-train zero-estimate zero-bench zero-ckpt zero-comm-selftest)
  if(TARGET ${_tool})
    # The installed tool keeps the paths of the shared libraries it linked
    # (LibTorch in its wheel, CUDA, MPI): CMake strips the build tree's
    # RUNPATH at install, and the tool then could not find libtorch.so.
    set_target_properties(${_tool} PROPERTIES INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib"
                                              INSTALL_RPATH_USE_LINK_PATH TRUE)
    install(TARGETS ${_tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(_zero_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/zerocpp)
install(EXPORT zerocppTargets NAMESPACE zerocpp:: DESTINATION ${_zero_cmake_dir})
set(ZERO_CONFIG_TORCH_DIR "${Torch_DIR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zerocppConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/zerocppConfig.cmake INSTALL_DESTINATION ${_zero_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/zerocppConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/zerocppConfig.cmake ${CMAKE_BINARY_DIR}/zerocppConfigVersion.cmake
        DESTINATION ${_zero_cmake_dir})
