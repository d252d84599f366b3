/* libFuzzer target: the safetensors header parser (dcp/safetensors.c).
 * The input is a whole file (written to an in-memory file); a file that
 * opens is also read back in pieces, so offsets and shapes the parser
 * accepted are exercised by the readers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  if (fd < 0) fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  weft_safetensors *f = NULL;
  if (weft_safetensors_open(path, &f) == WEFT_OK) {
    for (int64_t i = 0; i < weft_safetensors_count(f) && i < 16; i++) {
      weft_safetensors_info info;
      if (weft_safetensors_get(f, i, &info) != WEFT_OK) continue;
      if (info.numel > 0 && info.numel <= 4096) {
        void *buf = malloc((size_t)info.numel * 8); /* room for any dtype */
        weft_safetensors_read(f, info.name, weft_dtype_is_float(info.dtype) ? WEFT_F32 : info.dtype,
                              buf, info.numel);
        free(buf);
      }
      (void)weft_safetensors_metadata(f, "format");
    }
    weft_safetensors_close(f);
  }
  return 0;
}
