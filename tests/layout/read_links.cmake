# read_links(<file> <built_var>): the libraries of a link list written at generation
# time ("target=dep,dep" lines) into <built_var>, and each one's direct links to
# tessera libraries (deduplicated) into links_<target>.
function(read_links file built_var)
  file(STRINGS "${file}" lines)
  set(built "")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^([a-z0-9_]+)=(.*)$")
      continue()
    endif()
    set(target "${CMAKE_MATCH_1}")
    string(REPLACE "," ";" deps "${CMAKE_MATCH_2}")
    list(FILTER deps INCLUDE REGEX "^(tessera_|backend_|loader_)[a-z0-9_]+$")
    list(REMOVE_DUPLICATES deps)
    list(APPEND built "${target}")
    set("links_${target}" "${deps}" PARENT_SCOPE)
  endforeach()
  set(${built_var} "${built}" PARENT_SCOPE)
endfunction()
