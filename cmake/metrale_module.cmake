# Shared compile flags for every metrale target.
add_library(metrale_flags INTERFACE)
target_compile_options(metrale_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-missing-field-initializers>
  $<$<BOOL:${METRALE_WERROR}>:-Werror>
  # g++ 12 at -O3 reports std::string concatenation as overlapping memcpy (GCC bug 105651).
  $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>
  # No silent a*b+c fusing: a kernel and its scalar reference must round the same way at every
  # optimisation level and on every SIMD target; kernels that want FMA say so explicitly.
  -ffp-contract=off)
target_include_directories(metrale_flags INTERFACE ${PROJECT_SOURCE_DIR}/src)
if(METRALE_SANITIZE)
  target_compile_options(metrale_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer
                                                 -fno-sanitize-recover=undefined)
  target_link_options(metrale_flags INTERFACE -fsanitize=address,undefined)
endif()

# metrale_add_module(NAME DIR dir DEPS ...)
# One library per module folder; its sources are the folder's *.cc (not recursing into
# sub-folders that are modules of their own).
function(metrale_add_module name)
  cmake_parse_arguments(M "" "DIR" "DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${M_DIR}/*.cc)
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_link_libraries(${name} PUBLIC metrale_flags ${M_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE metrale_flags ${M_DEPS})
  endif()
endfunction()

# metrale_add_tests(DIR dir DEPS ...)
# One GoogleTest executable per tests/ folder, named after the folder
# (tests/io/safetensors -> io_safetensors_tests); tests run from the source root so they can
# read committed fixtures by relative path.
function(metrale_add_tests)
  cmake_parse_arguments(T "" "DIR;LABEL" "DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS ${T_DIR}/*_test.cc)
  if(NOT srcs)
    return()
  endif()
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/tests ${T_DIR})
  string(REPLACE "/" "_" exe "${rel}_tests")
  add_executable(${exe} ${srcs})
  target_link_libraries(${exe} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${exe} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${exe} PRIVATE METRALE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  set(props WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} DISCOVERY_TIMEOUT 60)
  if(T_LABEL)
    gtest_discover_tests(${exe} ${props} PROPERTIES LABELS ${T_LABEL})
  else()
    gtest_discover_tests(${exe} ${props})
  endif()
endfunction()
