# What the documentation checks (readme-snippet.cmake, doc-links.cmake) share. Included by a
# script run as `cmake -DROOT=<repository root> -P SCRIPT`: makes ROOT absolute and sets `pages`
# to the pages checked, README.md and every docs/*.md, from ROOT; defines doc_check_done.
cmake_minimum_required(VERSION 3.16)
if(NOT DEFINED ROOT)
  get_filename_component(_doc_script "${CMAKE_SCRIPT_MODE_FILE}" NAME)
  message(FATAL_ERROR "${_doc_script}: pass -DROOT=<repository root>")
endif()
get_filename_component(ROOT "${ROOT}" ABSOLUTE)
file(GLOB pages RELATIVE "${ROOT}" "${ROOT}/docs/*.md")
list(SORT pages)
set(pages README.md ${pages})

# doc_check_done(ERRORS FAILURE SUCCESS): fails with FAILURE followed by ERRORS (one "\n  "-led
# line each) when there are any, else reports SUCCESS.
function(doc_check_done errors failure success)
  if(NOT errors STREQUAL "")
    message(FATAL_ERROR "${failure}:${errors}")
  endif()
  message(STATUS "${success}")
endfunction()
