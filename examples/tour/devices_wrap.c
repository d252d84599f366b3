/* Compiles README.md's "Devices" fragment (extract.py ... devices THIS):
 * the names it uses are this function's parameters and locals. Built, not
 * run (it needs a CUDA device). */
#include <weft/weft.h>

void weft_readme_devices(weft_mesh *mesh, int dp, const int64_t *shape, const weft_tensor *host,
                         float *out, float *rstd, const float *w, int64_t N, int64_t C,
                         weft_tensor *y, float *grads, int64_t n);
void weft_readme_devices(weft_mesh *mesh, int dp, const int64_t *shape, const weft_tensor *host,
                         float *out, float *rstd, const float *w, int64_t N, int64_t C,
                         weft_tensor *y, float *grads, int64_t n) {
  int dev = 0;
  /* @SNIPPET@ */
  (void)dev;
}
