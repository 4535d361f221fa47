# Checks that a README snippet is its file, byte for byte: the README shows the file SNIPPET
# (its path from the repository root) right after a "<!-- snippet: SNIPPET -->" line, in a
# ```c fence.
# Usage: cmake -DREADME=README.md -DSNIPPET=c-tests/example.c -DFILE=<path to it> -P readme-snippet.cmake
file(READ "${README}" readme)
file(READ "${FILE}" expected)
set(marker "<!-- snippet: ${SNIPPET} -->\n```c\n")
string(FIND "${readme}" "${marker}" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${README} has no \"<!-- snippet: ${SNIPPET} -->\" followed by a ```c fence")
endif()
string(LENGTH "${marker}" marker_length)
math(EXPR start "${start} + ${marker_length}")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "\n```\n" end)
if(end EQUAL -1)
  message(FATAL_ERROR "${README}: the fence of the ${SNIPPET} snippet is not closed")
endif()
math(EXPR end "${end} + 1")
string(SUBSTRING "${rest}" 0 ${end} snippet)
if(NOT snippet STREQUAL expected)
  message(FATAL_ERROR "The README's ${SNIPPET} snippet differs from ${FILE}: paste the file into the README")
endif()
message(STATUS "README snippet equals ${FILE}")
