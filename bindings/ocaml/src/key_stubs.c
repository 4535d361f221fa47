/* The key builder (kc_key_builder_*). It neither waits nor runs callbacks, so these stubs keep
 * the runtime lock and pass OCaml strings straight through: the builder copies what it keeps. */
#include "ml_kcache.h"

#define Builder_ptr(v) (*(kc_key_builder **)Data_custom_val(v))

/* Freeing a builder touches no OCaml value, so the GC may do it; Kcache.Key.make also frees
 * it as soon as the key is made. */
static void ml_builder_finalize(value v) {
  kc_key_builder_free(Builder_ptr(v));
  Builder_ptr(v) = NULL;
}

static struct custom_operations ml_builder_ops = {
    "kcache.key_builder",    ml_builder_finalize,        custom_compare_default,
    custom_hash_default,     custom_serialize_default,   custom_deserialize_default,
    custom_compare_ext_default, custom_fixed_length_default};

static kc_key_builder *ml_builder_of(value v) {
  kc_key_builder *b = Builder_ptr(v);
  if (b == NULL) caml_invalid_argument("Kcache.Key: the builder was freed");
  return b;
}

static const uint8_t *ml_bytes(value v) { return (const uint8_t *)String_val(v); }

value ml_kc_key_builder_new(value unit) {
  CAMLparam1(unit);
  CAMLlocal1(vb);
  kc_key_builder *b = NULL;
  ml_check(kc_key_builder_new(&b));
  vb = caml_alloc_custom(&ml_builder_ops, sizeof(kc_key_builder *), 0, 1);
  Builder_ptr(vb) = b;
  CAMLreturn(vb);
}

value ml_kc_key_builder_free(value vb) {
  ml_builder_finalize(vb);
  return Val_unit;
}

/* `vfield` is the index of a Kcache.Key field, in the order of the KC_KEY_* constants. */
value ml_kc_key_builder_set(value vb, value vfield, value vbytes) {
  ml_check(kc_key_builder_set(ml_builder_of(vb), (uint32_t)Int_val(vfield), ml_bytes(vbytes),
                              caml_string_length(vbytes)));
  return Val_unit;
}

/* `vkind`: 0 an option, 1 an extra input, 2 a dependency (name and contents). */
value ml_kc_key_builder_add(value vb, value vkind, value vname, value vvalue) {
  kc_key_builder *b = ml_builder_of(vb);
  const uint8_t *name = ml_bytes(vname), *bytes = ml_bytes(vvalue);
  size_t name_len = caml_string_length(vname), len = caml_string_length(vvalue);
  kc_status status;
  switch (Int_val(vkind)) {
    case 0: status = kc_key_builder_option(b, name, name_len, bytes, len); break;
    case 1: status = kc_key_builder_extra(b, name, name_len, bytes, len); break;
    default: status = kc_key_builder_dependency(b, name, name_len, bytes, len); break;
  }
  ml_check(status);
  return Val_unit;
}

value ml_kc_key_builder_ordered_option(value vb, value varg) {
  ml_check(kc_key_builder_ordered_option(ml_builder_of(vb), ml_bytes(varg),
                                         caml_string_length(varg)));
  return Val_unit;
}

value ml_kc_key_builder_finish(value vb) {
  CAMLparam1(vb);
  uint8_t key[KC_KEY_LEN];
  ml_check(kc_key_builder_finish(ml_builder_of(vb), key));
  CAMLreturn(caml_alloc_initialized_string(KC_KEY_LEN, (const char *)key));
}
