/* libFuzzer target: the checkpoint metadata parser (dcp/format.c) with
 * every validation rule. Any input must give WEFT_OK or an error status,
 * never a crash, hang, leak or out-of-bounds access (ASan). */
#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  weft_dcp_metadata_check((const char *)data, size, "fuzz");
  return 0;
}
