/* Status reporting and key copies, shared by every stub file. */
#include "ml_kcache.h"

const value *ml_named(const char *name) {
  const value *v = caml_named_value(name);
  if (v == NULL) caml_failwith(name);
  return v;
}

/* Runs on the thread that made the failed call, so kcache's per-thread details are that
 * call's. */
void ml_raise_status(kc_status status) {
  CAMLparam0();
  CAMLlocal1(msg);
  if (status == KC_ERR_BUILD_FAILED)
    caml_raise_with_arg(*ml_named("kcache.build_code"), Val_int(kc_last_build_error()));
  msg = caml_copy_string(kc_last_error_message());
  /* Kcache.Status.t lists the codes from KC_ERR_INVALID_ARGUMENT on, then Unknown. */
  int index = (status >= KC_ERR_INVALID_ARGUMENT && status <= KC_ERR_BUFFER_TOO_SMALL)
                  ? (int)status - 1
                  : KC_ERR_BUFFER_TOO_SMALL;
  value args[2] = {Val_int(index), msg};
  caml_raise_with_args(*ml_named("kcache.error"), 2, args);
  CAMLreturn0;
}

void ml_check(kc_status status) {
  if (status != KC_OK) ml_raise_status(status);
}

value ml_counters(const uint64_t *fields, size_t n, size_t size) {
  value v = caml_alloc_tuple(size);
  for (size_t i = 0; i < size; i++) Store_field(v, i, i < n ? Val_long((intnat)fields[i]) : Val_false);
  return v;
}

uint8_t *ml_key_copy(value vkey, uint8_t *small, size_t *len) {
  *len = caml_string_length(vkey);
  uint8_t *key = *len <= ML_SMALL_KEY ? small : malloc(*len);
  if (key == NULL) caml_raise_out_of_memory();
  memcpy(key, String_val(vkey), *len);
  return key;
}
