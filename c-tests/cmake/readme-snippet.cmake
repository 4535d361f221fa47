# The documentation's snippet check. In README.md and every docs/*.md, a line that is
# "<!-- snippet: PATH -->" must be followed by a fenced block (``` with any language) whose
# contents are the file PATH (from the repository root), byte for byte. Every marker of every
# page is checked, whichever caller runs this.
#
# Usage: cmake -DROOT=<repository root> [-DSNIPPET=PATH] [-DMIN_COUNT=N] -P readme-snippet.cmake
#   SNIPPET: also fail unless some page shows PATH (a caller that builds PATH asks for this).
#   MIN_COUNT: also fail unless at least N markers were found.
include("${CMAKE_CURRENT_LIST_DIR}/doc-pages.cmake")

# split_at(TEXT MARKER OUT [MISSING]): whether TEXT holds MARKER goes in OUT; if it does, what
# comes before its first occurrence goes in OUT_HEAD and what follows it in OUT_TAIL. If it does
# not and MISSING is given, MISSING is added to the errors, as one about the current page.
function(split_at text marker out)
  string(FIND "${text}" "${marker}" at)
  if(at EQUAL -1)
    set(${out} FALSE PARENT_SCOPE)
    if(ARGC GREATER 3)
      set(errors "${errors}\n  ${page}: ${ARGV3}" PARENT_SCOPE)
    endif()
    return()
  endif()
  string(SUBSTRING "${text}" 0 ${at} head)
  string(LENGTH "${marker}" length)
  math(EXPR at "${at} + ${length}")
  string(SUBSTRING "${text}" ${at} -1 tail)
  set(${out} TRUE PARENT_SCOPE)
  set(${out}_HEAD "${head}" PARENT_SCOPE)
  set(${out}_TAIL "${tail}" PARENT_SCOPE)
endfunction()

set(count 0)
set(errors "")
set(shown "")
foreach(page IN LISTS pages)
  file(READ "${ROOT}/${page}" text)
  # A marker starts a line; the newline put in front lets the first line be one.
  string(PREPEND text "\n")
  while(TRUE)
    split_at("${text}" "\n<!-- snippet: " marker)
    if(NOT marker)
      break()
    endif()
    split_at("${marker_TAIL}" " -->\n" path
             "a snippet marker is not closed by \" -->\" at the end of its line")
    if(NOT path)
      break()
    endif()
    set(path "${path_HEAD}")
    math(EXPR count "${count} + 1")
    list(APPEND shown "${path}")
    # The fence opens on the next line: ``` and an optional language.
    split_at("${path_TAIL}" "\n" fence)
    if(NOT fence OR NOT fence_HEAD MATCHES "^```")
      string(APPEND errors "\n  ${page}: the ${path} marker is not followed by a ``` fence")
      set(text "${path_TAIL}")
      continue()
    endif()
    split_at("${fence_TAIL}" "\n```\n" body "the fence of the ${path} snippet is not closed")
    if(NOT body)
      break()
    endif()
    # The snippet ends with its last newline; the closing fence's line is not part of it, and the
    # newline before what follows is kept, so a marker right after the fence is still found.
    set(snippet "${body_HEAD}\n")
    set(text "\n${body_TAIL}")
    if(NOT EXISTS "${ROOT}/${path}" OR IS_DIRECTORY "${ROOT}/${path}")
      string(APPEND errors "\n  ${page}: the snippet names ${path}, which is not a file")
      continue()
    endif()
    file(READ "${ROOT}/${path}" expected)
    if(NOT snippet STREQUAL expected)
      string(APPEND errors "\n  ${page}: the ${path} snippet differs from the file: paste the file into the page")
    endif()
  endwhile()
endforeach()

if(DEFINED SNIPPET AND NOT SNIPPET STREQUAL "")
  list(FIND shown "${SNIPPET}" found)
  if(found EQUAL -1)
    string(APPEND errors "\n  no page shows ${SNIPPET} (a \"<!-- snippet: ${SNIPPET} -->\" line before its fence)")
  endif()
endif()
if(DEFINED MIN_COUNT AND count LESS MIN_COUNT)
  string(APPEND errors "\n  ${count} snippets found, expected at least ${MIN_COUNT}")
endif()
doc_check_done("${errors}" "Documentation snippets out of date"
               "${count} documentation snippets equal their files")
