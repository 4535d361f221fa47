# Checks a built or installed libkcache.so:
#   cmake -DLIBRARY=path/libkcache.so.X.Y.Z -DSONAME=libkcache.so.X [-DNM=nm] [-DREADELF=readelf]
#         -P check-library.cmake
# - its SONAME is SONAME;
# - it exports functions named kc_* only;
# - it needs only C-runtime libraries: no GPU runtime (those are loaded at run time) and no
#   Rust standard library.
foreach(_var LIBRARY SONAME)
  if(NOT ${_var})
    message(FATAL_ERROR "check-library.cmake: pass -D${_var}=...")
  endif()
endforeach()
if(NOT NM)
  set(NM nm)
endif()
if(NOT READELF)
  set(READELF readelf)
endif()

execute_process(COMMAND "${READELF}" -d "${LIBRARY}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _dynamic ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIBRARY} failed: ${_err}")
endif()

if(NOT _dynamic MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]")
  message(FATAL_ERROR "${LIBRARY}: no SONAME (expected ${SONAME})")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL SONAME)
  message(FATAL_ERROR "${LIBRARY}: SONAME is ${CMAKE_MATCH_1}, expected ${SONAME}")
endif()

set(_allowed_needed
  "^libc\\.so\\.6$" "^libm\\.so\\.6$" "^libgcc_s\\.so\\.1$" "^libdl\\.so\\.2$" "^libpthread\\.so\\.0$"
  "^librt\\.so\\.1$" "^libutil\\.so\\.1$" "^ld-linux[-a-z0-9_.]*\\.so\\.[0-9]+$")
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]*\\]" _needed_lines "${_dynamic}")
set(_bad_needed)
foreach(_line IN LISTS _needed_lines)
  string(REGEX REPLACE ".*\\[([^]]*)\\]" "\\1" _lib "${_line}")
  set(_ok FALSE)
  foreach(_re IN LISTS _allowed_needed)
    if(_lib MATCHES "${_re}")
      set(_ok TRUE)
    endif()
  endforeach()
  if(NOT _ok)
    list(APPEND _bad_needed "${_lib}")
  endif()
endforeach()
if(_bad_needed)
  message(FATAL_ERROR "${LIBRARY}: NEEDED has libraries beyond the C runtime: ${_bad_needed}")
endif()

execute_process(COMMAND "${NM}" -D --defined-only "${LIBRARY}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _symbols ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed: ${_err}")
endif()
string(REGEX REPLACE "\n$" "" _symbols "${_symbols}")
string(REPLACE "\n" ";" _symbol_lines "${_symbols}")
set(_exported 0)
set(_foreign)
foreach(_line IN LISTS _symbol_lines)
  # "<address> <type> <name>[@version]"
  string(REGEX REPLACE "^[0-9a-fA-F]* *[A-Za-z] " "" _name "${_line}")
  string(REGEX REPLACE "@.*" "" _name "${_name}")
  if(_name MATCHES "^kc_[A-Za-z0-9_]+$")
    math(EXPR _exported "${_exported} + 1")
  elseif(NOT _name STREQUAL "")
    list(APPEND _foreign "${_name}")
  endif()
endforeach()
if(_foreign)
  message(FATAL_ERROR "${LIBRARY}: exports symbols outside kc_*: ${_foreign}")
endif()
if(_exported EQUAL 0)
  message(FATAL_ERROR "${LIBRARY}: exports no kc_* function")
endif()
message(STATUS "${LIBRARY}: SONAME ${SONAME}, ${_exported} kc_* exports, C-runtime dependencies only")
