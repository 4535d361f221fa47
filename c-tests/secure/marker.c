/* Stands in for a library that the user who starts a setuid program names in the environment
 * (KCACHE_OPENCL_LIBRARY, KCACHE_CUDA_LIBRARY, KCACHE_NVRTC_LIBRARY): loading it would run the
 * user's code with the program's privileges. Its constructor leaves a file at MARKER, so the
 * test can tell whether it was ever loaded. */
#include <stdio.h>

#ifndef MARKER
#error "build with -DMARKER='\"/path/of/the/marker\"'"
#endif

__attribute__((constructor)) static void loaded(void) {
  FILE *f = fopen(MARKER, "w");
  if (f != NULL) {
    fputs("loaded\n", f);
    fclose(f);
  }
}
