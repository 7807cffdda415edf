/* The C ABI header compiles as plain C and links: init, rejected calls, the error messages. */
#include <stdio.h>
#include <string.h>

#include "hopattn/hopattn.h"

int main(void) {
  hopattn_forward_args args;
  hopattn_forward_args_init(&args);
  if (args.struct_size != sizeof(args) || args.window_left != -1 || args.sinks.data != NULL || args.sinks.rank != 0 ||
      args.softcap != 0.0f || args.q_descale.data != NULL || args.k_descale.data != NULL ||
      args.v_descale.data != NULL || HOPATTN_FLOAT8_E4M3 != 3) {
    fprintf(stderr, "hopattn_forward_args_init did not set the defaults\n");
    return 1;
  }
  hopattn_backward_args backward;
  hopattn_backward_args_init(&backward);
  if (backward.struct_size != sizeof(backward) || backward.sinks.data != NULL || backward.dsinks.data != NULL ||
      backward.softcap != 0.0f) {
    fprintf(stderr, "hopattn_backward_args_init did not set the defaults\n");
    return 1;
  }
  /* All tensors empty: q.rank is 0, which validation must reject with a message. */
  if (hopattn_forward(&args, NULL) != HOPATTN_ERROR_INVALID_ARGUMENT ||
      strstr(hopattn_last_error(), "q.rank") == NULL) {
    fprintf(stderr, "unexpected result: %s\n", hopattn_last_error());
    return 1;
  }
  /* The KV-cache call: no cache_seqlens, which validation must name. */
  hopattn_kvcache_args kv;
  hopattn_kvcache_args_init(&kv);
  if (kv.struct_size != sizeof(kv) || kv.pack_gqa != -1 || kv.page_table.data != NULL || kv.rotary.interleaved != 0 ||
      kv.sinks.data != NULL || kv.softcap != 0.0f) {
    fprintf(stderr, "hopattn_kvcache_args_init did not set the defaults\n");
    return 1;
  }
  kv.q = args.q;
  size_t bytes = 0;
  if (hopattn_forward_kvcache_workspace_size(&kv, &bytes) != HOPATTN_ERROR_INVALID_ARGUMENT ||
      hopattn_forward_kvcache(&kv, NULL, 0, NULL) != HOPATTN_ERROR_INVALID_ARGUMENT ||
      strstr(hopattn_last_error(), "q.") == NULL) {
    fprintf(stderr, "unexpected kvcache result: %s\n", hopattn_last_error());
    return 1;
  }
  printf("C ABI ok: %s\n", hopattn_version());
  return 0;
}
