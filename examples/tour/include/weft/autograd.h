/* <weft/autograd.h> inside the source tree, for the README's tour
 * (examples/tour): installed, the headers sit together in include/weft/. */
#include "../../../../nn/autograd.h"
