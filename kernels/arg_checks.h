/* kernels/arg_checks.h — private: the argument checks of the layer kernels,
 * shared by kernels/cpu/layers.c and kernels/cuda/layers.cu so both backends
 * reject the same inputs with the same messages (C and C++). */
#ifndef WEFT_ARG_CHECKS_H
#define WEFT_ARG_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Every size must be >= 0 (the enclosing function returns the error). */
#define CHECK_SIZES(...)                                                      \
  do {                                                                        \
    const int64_t sizes_[] = {__VA_ARGS__};                                   \
    for (size_t i_ = 0; i_ < sizeof sizes_ / sizeof sizes_[0]; i_++)          \
      if (sizes_[i_] < 0)                                                     \
        return weft_error(WEFT_ERR_INVALID, "size argument %zu is negative (%lld)", i_ + 1, \
                          (long long)sizes_[i_]);                             \
  } while (0)

/* A pointer to an array of `count` elements may be NULL only if count == 0. */
#define CHECK_PTR(p, count)                                                   \
  do {                                                                        \
    if ((p) == NULL && (count) > 0)                                           \
      return weft_error(WEFT_ERR_INVALID, "%s is NULL", #p);                  \
  } while (0)

#endif /* WEFT_ARG_CHECKS_H */
