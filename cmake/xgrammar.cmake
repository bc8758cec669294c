# xgrammar's C++ core (docs/dependencies.md): scripts/fetch-xgrammar.sh puts the pinned sdist in
# build/third_party; when its sources are there they are compiled here as a third-party static
# target (its own C++17, warnings off, our -Werror not applied, no LTO), without its Python
# bindings or CMake project. Without them metrale builds without structured outputs.
set(METRALE_XGRAMMAR_DIR "${PROJECT_SOURCE_DIR}/build/third_party/xgrammar-0.2.9"
    CACHE PATH "xgrammar sdist sources (scripts/fetch-xgrammar.sh)")
set(METRALE_HAVE_XGRAMMAR OFF)
if(EXISTS "${METRALE_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h")
  set(METRALE_HAVE_XGRAMMAR ON)
  file(GLOB xgrammar_srcs CONFIGURE_DEPENDS "${METRALE_XGRAMMAR_DIR}/cpp/*.cc"
       "${METRALE_XGRAMMAR_DIR}/cpp/support/*.cc" "${METRALE_XGRAMMAR_DIR}/cpp/converter_ext/*.cc")
  add_library(metrale_xgrammar STATIC ${xgrammar_srcs})
  set_target_properties(metrale_xgrammar PROPERTIES CXX_STANDARD 17 CXX_EXTENSIONS OFF
                                                    INTERPROCEDURAL_OPTIMIZATION OFF)
  # Optimised whatever the build type: its matcher runs once per constrained token.
  target_compile_options(metrale_xgrammar PRIVATE -w -O2)
  target_compile_definitions(metrale_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0)
  target_include_directories(metrale_xgrammar SYSTEM PUBLIC "${METRALE_XGRAMMAR_DIR}/include"
                             "${METRALE_XGRAMMAR_DIR}/3rdparty/picojson"
                             "${METRALE_XGRAMMAR_DIR}/3rdparty/dlpack/include")
  target_link_libraries(metrale_xgrammar PUBLIC Threads::Threads)
  message(STATUS "xgrammar: ${METRALE_XGRAMMAR_DIR} (structured outputs on)")
else()
  message(STATUS "xgrammar: not found at ${METRALE_XGRAMMAR_DIR} (run scripts/fetch-xgrammar.sh); "
                 "structured outputs off")
endif()
# CI (scripts/test.sh exports METRALE_REQUIRE_XGRAMMAR=1) must not build without it: the grammar
# tests would skip instead of run.
if(NOT METRALE_HAVE_XGRAMMAR AND "$ENV{METRALE_REQUIRE_XGRAMMAR}" STREQUAL "1")
  message(FATAL_ERROR "xgrammar: required (METRALE_REQUIRE_XGRAMMAR=1) but not found at "
                      "${METRALE_XGRAMMAR_DIR}; run scripts/fetch-xgrammar.sh")
endif()
