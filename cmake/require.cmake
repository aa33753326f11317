# A missing dependency stops configure with one line that names the Debian package to install,
# instead of the backtrace of whichever package config tripped over it.
#
#   hyla_require_package(NAME DEBIAN_PACKAGE [extra find_package arguments])
#   hyla_require_pkg_config(PREFIX MODULE DEBIAN_PACKAGE)
macro(hyla_missing debian_package what)
  message(FATAL_ERROR "hyla: ${what} not found: install the Debian package '${debian_package}' "
    "(`bash scripts/setup.sh` installs every package the build needs)")
endmacro()

macro(hyla_require_package name debian_package)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    hyla_missing(${debian_package} "${name}")
  endif()
endmacro()

macro(hyla_require_pkg_config prefix module debian_package)
  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${module})
  if(NOT ${prefix}_FOUND)
    hyla_missing(${debian_package} "pkg-config module ${module}")
  endif()
endmacro()
