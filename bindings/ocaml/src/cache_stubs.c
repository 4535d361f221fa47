/* The memory-tier cache and its leases (kc_cache_*, kc_lease_*). */
#include "ml_kcache.h"

/* What a build callback needs: `build` points at a local root of the calling stub, which the
 * GC updates if the closure moves while the runtime lock is released. */
struct ml_build_ctx {
  struct ml_cache *mc;
  value *build;
};

/* A build whose OCaml wrapper itself raised (out of memory, stack overflow). */
#define ML_BUILD_UNCAUGHT (-1)

#define Cache_ptr(v) (*(struct ml_cache **)Data_custom_val(v))
#define Lease_ptr(v) (*(kc_lease **)Data_custom_val(v))

/* No finalizers: freeing a cache or releasing a lease may run destroy callbacks, which need
 * the runtime lock that a finalizer runs under. `Kcache.free` and `Kcache.with_lease` do it. */
static struct custom_operations ml_cache_ops = {
    "kcache.cache",          custom_finalize_default,    custom_compare_default,
    custom_hash_default,     custom_serialize_default,   custom_deserialize_default,
    custom_compare_ext_default, custom_fixed_length_default};

static struct custom_operations ml_lease_ops = {
    "kcache.lease",          custom_finalize_default,    custom_compare_default,
    custom_hash_default,     custom_serialize_default,   custom_deserialize_default,
    custom_compare_ext_default, custom_fixed_length_default};

/* The OCaml halves of the callbacks, looked up when a cache is created (where a missing one
 * can raise) so that the callbacks themselves never raise. */
static const value *ml_run_build;
static const value *ml_run_destroy;

struct ml_cache *ml_cache_of(value vcache) {
  struct ml_cache *mc = Cache_ptr(vcache);
  if (mc == NULL) caml_invalid_argument("Kcache: the cache was freed");
  return mc;
}

value ml_lease_alloc(kc_lease *lease) {
  value vlease = caml_alloc_custom(&ml_lease_ops, sizeof(kc_lease *), 0, 1);
  Lease_ptr(vlease) = lease;
  return vlease;
}

/* Drops one reference; the last one unroots the state. Runtime lock held. */
static void ml_cache_unref(struct ml_cache *mc) {
  if (--mc->refs == 0) {
    caml_remove_generational_global_root(&mc->state);
    free(mc);
  }
}

int ml_run(struct ml_cache *mc, const value *fn, const uint8_t *bytes, size_t len,
           void **out_value, uint64_t *out_weight) {
  int code;
  caml_acquire_runtime_system();
  {
    CAMLparam0();
    CAMLlocal2(vbytes, built);
    vbytes = caml_alloc_initialized_string(len, (const char *)bytes);
    value res = caml_callback3_exn(*ml_run_build, mc->state, *fn, vbytes);
    if (Is_exception_result(res)) {
      code = ML_BUILD_UNCAUGHT;
    } else if (Tag_val(res) == 0) { /* Built (value, weight) */
      built = res;
      value *box = malloc(sizeof(value));
      if (box == NULL) {
        code = ML_BUILD_UNCAUGHT;
      } else {
        *box = Field(built, 0);
        caml_register_generational_global_root(box);
        mc->refs++;
        *out_value = box;
        *out_weight = (uint64_t)Long_val(Field(built, 1));
        code = 0;
      }
    } else { /* Failed code */
      code = Int_val(Field(res, 0));
    }
    CAMLdrop;
  }
  caml_release_runtime_system();
  return code;
}

static int ml_build(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                    uint64_t *out_weight) {
  struct ml_build_ctx *b = ctx;
  return ml_run(b->mc, b->build, key, key_len, out_value, out_weight);
}

/* Set while this thread releases a lease with the runtime lock held (see
 * ml_kc_lease_release): a destroy run by that release is on this thread, which has the lock
 * already. Cleared while the destroy runs OCaml code, so that a kcache call made from that
 * code, which releases the lock, gets destroys that take it back. */
static _Thread_local int ml_lock_held;

static int ml_destroy(void *ctx, void *v) {
  struct ml_cache *mc = ctx;
  value *box = v;
  int held = ml_lock_held;
  ml_lock_held = 0;
  if (!held) caml_acquire_runtime_system();
  value res = caml_callback2_exn(*ml_run_destroy, mc->state, *box);
  int code = Is_exception_result(res) ? 1 : Int_val(res);
  caml_remove_generational_global_root(box);
  free(box);
  ml_cache_unref(mc);
  if (!held) caml_release_runtime_system();
  ml_lock_held = held;
  return code;
}

value ml_kc_cache_new(value vmax_entries, value vmax_weight, value vinvalidated, value vstate) {
  CAMLparam4(vmax_entries, vmax_weight, vinvalidated, vstate);
  CAMLlocal1(vcache);
  ml_run_build = ml_named("kcache.run_build");
  ml_run_destroy = ml_named("kcache.run_destroy");
  struct ml_cache *mc = malloc(sizeof *mc);
  if (mc == NULL) caml_raise_out_of_memory();
  mc->cache = NULL;
  mc->state = vstate;
  mc->refs = 1;
  mc->calls = 0;
  caml_register_generational_global_root(&mc->state);
  kc_cache_options opts = kc_cache_options_default();
  opts.max_entries = (uint64_t)Long_val(vmax_entries);
  opts.max_weight = (uint64_t)Long_val(vmax_weight);
  opts.invalidated_by_clear = Bool_val(vinvalidated);
  opts.destroy = ml_destroy;
  opts.destroy_ctx = mc;
  kc_status status = kc_cache_new(&opts, &mc->cache);
  if (status != KC_OK) {
    ml_cache_unref(mc);
    ml_raise_status(status);
  }
  vcache = caml_alloc_custom(&ml_cache_ops, sizeof(struct ml_cache *), 0, 1);
  Cache_ptr(vcache) = mc;
  CAMLreturn(vcache);
}

value ml_kc_cache_free(value vcache) {
  CAMLparam1(vcache);
  struct ml_cache *mc = Cache_ptr(vcache);
  if (mc == NULL) CAMLreturn(Val_unit);
  if (mc->calls > 0) caml_invalid_argument("Kcache.free: calls on the cache are running");
  Cache_ptr(vcache) = NULL;
  caml_release_runtime_system();
  kc_cache_free(mc->cache);
  caml_acquire_runtime_system();
  ml_cache_unref(mc);
  CAMLreturn(Val_unit);
}

value ml_kc_cache_find_or_build(value vcache, value vkey, value vdevice, value vbuild) {
  CAMLparam4(vcache, vkey, vdevice, vbuild);
  CAMLlocal1(vlease);
  struct ml_cache *mc = ml_cache_of(vcache);
  uint8_t small[ML_SMALL_KEY];
  size_t len;
  uint8_t *key = ml_key_copy(vkey, small, &len);
  int64_t device = Long_val(vdevice);
  struct ml_build_ctx ctx = {mc, &vbuild};
  kc_lease *lease = NULL;
  kc_status status;
  ML_UNLOCKED_CALL(mc->calls, status,
                   kc_cache_find_or_build(mc->cache, key, len, device, ml_build, &ctx, &lease));
  if (key != small) free(key);
  ml_check(status);
  vlease = ml_lease_alloc(lease);
  CAMLreturn(vlease);
}


value ml_kc_cache_remove(value vcache, value vkey) {
  CAMLparam2(vcache, vkey);
  struct ml_cache *mc = ml_cache_of(vcache);
  uint8_t small[ML_SMALL_KEY];
  size_t len;
  uint8_t *key = ml_key_copy(vkey, small, &len);
  kc_status status;
  ML_UNLOCKED_CALL(mc->calls, status, kc_cache_remove(mc->cache, key, len));
  if (key != small) free(key);
  if (status == KC_ERR_NOT_FOUND) CAMLreturn(Val_false);
  ml_check(status);
  CAMLreturn(Val_true);
}

value ml_kc_cache_evict_device(value vcache, value vdevice) {
  CAMLparam2(vcache, vdevice);
  struct ml_cache *mc = ml_cache_of(vcache);
  int64_t device = Long_val(vdevice);
  ML_UNLOCKED_CHECKED(mc->calls, kc_cache_evict_device(mc->cache, device));
  CAMLreturn(Val_unit);
}

value ml_kc_cache_clear(value vcache) {
  CAMLparam1(vcache);
  struct ml_cache *mc = ml_cache_of(vcache);
  ML_UNLOCKED_CHECKED(mc->calls, kc_cache_clear(mc->cache));
  CAMLreturn(Val_unit);
}

/* The calls below neither wait nor run callbacks: they keep the runtime lock. */

value ml_kc_cache_len(value vcache) {
  return Val_long(kc_cache_len(ml_cache_of(vcache)->cache));
}

value ml_kc_cache_reset_stats(value vcache) {
  ml_check(kc_cache_reset_stats(ml_cache_of(vcache)->cache));
  return Val_unit;
}

/* The fields in the order of Kcache.stats. */
value ml_kc_cache_stats(value vcache) {
  kc_cache_statistics s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  ml_check(kc_cache_stats(ml_cache_of(vcache)->cache, &s));
  const uint64_t fields[] = {s.hits,      s.misses,          s.builds,
                             s.build_failures, s.waits,      s.discarded,
                             s.capacity_evictions, s.device_evictions, s.clears,
                             s.destroys,  s.destroy_errors,  s.entries,
                             s.weight,    s.leases};
  const size_t n = sizeof fields / sizeof fields[0];
  return ml_counters(fields, n, n);
}

value ml_kc_lease_value(value vlease) {
  kc_lease *lease = Lease_ptr(vlease);
  if (lease == NULL) caml_invalid_argument("Kcache: the lease was released");
  return *(value *)kc_lease_value(lease);
}

value ml_kc_lease_weight(value vlease) {
  kc_lease *lease = Lease_ptr(vlease);
  if (lease == NULL) caml_invalid_argument("Kcache: the lease was released");
  return Val_long((intnat)kc_lease_weight(lease));
}

/* Releases once: the pointer is cleared first, so a second release is a no-op rather than a
 * double free. A release never waits, and the destroy it may run runs on this thread: the
 * runtime lock stays held, and ml_destroy is told so, which halves the lock traffic of a hit. */
value ml_kc_lease_release(value vlease) {
  kc_lease *lease = Lease_ptr(vlease);
  if (lease == NULL) return Val_unit;
  Lease_ptr(vlease) = NULL;
  ml_lock_held = 1;
  kc_lease_release(lease);
  ml_lock_held = 0;
  return Val_unit;
}

value ml_kc_version(value unit) {
  (void)unit;
  return caml_copy_string(kc_version());
}

value ml_kc_hit_rate(value vhits, value vmisses) {
  return caml_copy_double(kc_hit_rate((uint64_t)Long_val(vhits), (uint64_t)Long_val(vmisses)));
}
