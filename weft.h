/* weft/weft.h — the umbrella header: includes every weft library. */
#ifndef WEFT_H
#define WEFT_H
#include "weft_config.h"
#include "status.h"
#include "kernels.h"
#include "cuda.h"
#include "mesh.h"
#include "dtensor.h"
#include "nn.h"
#include "autograd.h"
#include "tp.h"
#include "fsdp.h"
#include "safetensors.h"
#include "dcp.h"
#include "gpt2.h"
#include "llama.h"
#include "tokens.h"
#endif
