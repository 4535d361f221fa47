# What every C test project under c-tests/ shares: where the header and the library under test
# are, warnings as errors, the language standards and the optional sanitizers. A project includes
# it after project() and calls kcache_test_target() on each target it builds.
#
# Cache settings:
#   KCACHE_INCLUDE_DIR  directory holding kcache.h (default: include/ of this repository)
#   KCACHE_LIB_DIR      directory holding libkcache.so (default: target/release)
#   KCACHE_SANITIZE     build with AddressSanitizer and UndefinedBehaviorSanitizer
get_filename_component(_kc_repository "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(KCACHE_INCLUDE_DIR "${_kc_repository}/include" CACHE PATH "Directory holding kcache.h")
set(KCACHE_LIB_DIR "${_kc_repository}/target/release"
    CACHE PATH "Directory holding the libkcache to test")
option(KCACHE_SANITIZE "Build the C side with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)

set(KCACHE_TEST_WARNINGS -Wall -Wextra -Wpedantic -Werror)
set(KCACHE_TEST_SANITIZE)
if(KCACHE_SANITIZE)
  set(KCACHE_TEST_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=all
                           -fno-omit-frame-pointer)
endif()

# The library under test is the shared one in KCACHE_LIB_DIR, named by path rather than searched
# for, so that a new KCACHE_LIB_DIR takes effect on the next configure.
set(KCACHE_SHARED_LIBRARY
    "${KCACHE_LIB_DIR}/${CMAKE_SHARED_LIBRARY_PREFIX}kcache${CMAKE_SHARED_LIBRARY_SUFFIX}")
if(NOT EXISTS "${KCACHE_SHARED_LIBRARY}" AND CMAKE_SOURCE_DIR STREQUAL CMAKE_CURRENT_SOURCE_DIR)
  # Only the top-level build (which stages the library later) may configure before it exists.
  message(FATAL_ERROR "no ${KCACHE_SHARED_LIBRARY}: build it (cargo build --release --lib) or "
                      "set KCACHE_LIB_DIR to the directory holding it")
endif()
# A library with a SONAME (libkcache.so.MAJOR: built by the CMake project, which asks build.rs for
# it) makes the executables ask for that name, which a directory holding only libkcache.so lacks:
# give it that name next to the tests. A plain cargo build has no SONAME and needs nothing.
set(KCACHE_TEST_RUNTIME_DIR "${KCACHE_LIB_DIR}")
if(EXISTS "${KCACHE_SHARED_LIBRARY}" AND CMAKE_OBJDUMP)
  execute_process(COMMAND "${CMAKE_OBJDUMP}" -p "${KCACHE_SHARED_LIBRARY}"
                  OUTPUT_VARIABLE _kc_dynamic RESULT_VARIABLE _kc_objdump_rc)
  if(_kc_objdump_rc EQUAL 0 AND _kc_dynamic MATCHES "SONAME +([^ \r\n]+)")
    set(KCACHE_TEST_RUNTIME_DIR "${CMAKE_CURRENT_BINARY_DIR}/lib")
    file(MAKE_DIRECTORY "${KCACHE_TEST_RUNTIME_DIR}")
    file(CREATE_LINK "${KCACHE_SHARED_LIBRARY}" "${KCACHE_TEST_RUNTIME_DIR}/${CMAKE_MATCH_1}" SYMBOLIC)
  endif()
endif()
add_library(kcache_under_test SHARED IMPORTED)
set_target_properties(kcache_under_test PROPERTIES IMPORTED_LOCATION "${KCACHE_SHARED_LIBRARY}")

# kcache_test_target(<target> [POSIX] [NO_LIBRARY])
# C99 and C++17 without extensions, the warnings, the sanitizers when KCACHE_SANITIZE is on, and
# kcache.h on the include path as a plain -I (an -isystem path would hide the header's warnings).
# POSIX: define _POSIX_C_SOURCE=200809L, which C99 alone hides (pthread barriers, clock_gettime,
# nanosleep, setrlimit, mkdir). NO_LIBRARY: do not link libkcache.
function(kcache_test_target target)
  cmake_parse_arguments(PARSE_ARGV 1 _kc "POSIX;NO_LIBRARY" "" "")
  set_target_properties(${target} PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF
                                             CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                                             CXX_EXTENSIONS OFF)
  target_include_directories(${target} PRIVATE "${KCACHE_INCLUDE_DIR}")
  target_compile_options(${target} PRIVATE ${KCACHE_TEST_WARNINGS} ${KCACHE_TEST_SANITIZE})
  get_target_property(_kc_type ${target} TYPE)
  if(NOT _kc_type STREQUAL "OBJECT_LIBRARY")
    target_link_options(${target} PRIVATE ${KCACHE_TEST_SANITIZE})
  endif()
  if(_kc_POSIX)
    target_compile_definitions(${target} PRIVATE _POSIX_C_SOURCE=200809L)
  endif()
  if(NOT _kc_NO_LIBRARY)
    target_link_libraries(${target} PRIVATE kcache_under_test)
    set_target_properties(${target} PROPERTIES BUILD_RPATH "${KCACHE_TEST_RUNTIME_DIR}")
  endif()
endfunction()
