/* The C ABI header compiles as plain C and links: init, a rejected call, the error message. */
#include <stdio.h>
#include <string.h>

#include "hopattn/hopattn.h"

int main(void) {
  hopattn_forward_args args;
  hopattn_forward_args_init(&args);
  if (args.struct_size != sizeof(args) || args.window_left != -1) {
    fprintf(stderr, "hopattn_forward_args_init did not set the defaults\n");
    return 1;
  }
  /* All tensors empty: q.rank is 0, which validation must reject with a message. */
  if (hopattn_forward(&args, NULL) != HOPATTN_ERROR_INVALID_ARGUMENT ||
      strstr(hopattn_last_error(), "q.rank") == NULL) {
    fprintf(stderr, "unexpected result: %s\n", hopattn_last_error());
    return 1;
  }
  printf("C ABI ok: %s\n", hopattn_version());
  return 0;
}
