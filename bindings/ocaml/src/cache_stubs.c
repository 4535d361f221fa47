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
/* A lease block's lease, taken out by one atomic exchange so that it is released once. */
#define Lease_slot(v) ((_Atomic(kc_lease *) *)Data_custom_val(v))

_Thread_local enum ml_mode ml_mode = ML_OUTSIDE;

/* Drops one of the struct's references; the last frees it. No OCaml value is touched, so the
 * GC's finalizer may do it. */
static void ml_cache_drop(struct ml_cache *mc) {
  if (atomic_fetch_sub(&mc->refs, 1) == 1) free(mc);
}

/* The block's reference. The cache itself is not freed here: that runs destroy callbacks,
 * which need the runtime lock that a finalizer runs under. `Kcache.free` does it; a cache
 * never freed keeps its struct too. */
static void ml_cache_finalize(value vcache) { ml_cache_drop(Cache_ptr(vcache)); }

/* No finalizer for leases: releasing one may run a destroy callback. `Kcache.with_lease`
 * releases. */
static struct custom_operations ml_cache_ops = {
    "kcache.cache",          ml_cache_finalize,          custom_compare_default,
    custom_hash_default,     custom_serialize_default,   custom_deserialize_default,
    custom_compare_ext_default, custom_fixed_length_default};

static struct custom_operations ml_lease_ops = {
    "kcache.lease",          custom_finalize_default,    custom_compare_default,
    custom_hash_default,     custom_serialize_default,   custom_deserialize_default,
    custom_compare_ext_default, custom_fixed_length_default};

/* The OCaml halves of the callbacks, looked up once, when Kcache is initialised (where a
 * missing one can raise), before any domain can create a cache: the callbacks only read
 * them, and never raise. */
static const value *ml_run_build;
static const value *ml_run_destroy;

value ml_kc_init(value unit) {
  (void)unit;
  ml_run_build = ml_named("kcache.run_build");
  ml_run_destroy = ml_named("kcache.run_destroy");
  return Val_unit;
}

/* Drops one of `live`; the last unroots the state. Runtime lock held. */
static void ml_cache_unlive(struct ml_cache *mc) {
  if (atomic_fetch_sub(&mc->live, 1) == 1) {
    caml_remove_generational_global_root(&mc->state);
    ml_cache_drop(mc);
  }
}

/* Frees the kc_cache, whose destroys take the runtime lock back. Runtime lock held. */
static void ml_cache_finish(struct ml_cache *mc) {
  ML_UNLOCKED(kc_cache_free(mc->cache));
  ml_cache_unlive(mc);
}

void ml_cache_leave(struct ml_cache *mc) {
  if (ml_leave(&mc->use)) ml_cache_finish(mc);
}

struct ml_cache *ml_cache_try_enter(value vcache) {
  struct ml_cache *mc = Cache_ptr(vcache);
  int entered = ml_enter(&mc->use);
  if (entered < 0) ml_cache_finish(mc);
  return entered > 0 ? mc : NULL;
}

struct ml_cache *ml_cache_enter(value vcache) {
  struct ml_cache *mc = ml_cache_try_enter(vcache);
  if (mc == NULL) caml_invalid_argument("Kcache: the cache was freed");
  return mc;
}

value ml_lease_alloc(kc_lease *lease) {
  value vlease = caml_alloc_custom(&ml_lease_ops, sizeof(_Atomic(kc_lease *)), 0, 1);
  atomic_init(Lease_slot(vlease), lease);
  return vlease;
}


int ml_run(struct ml_cache *mc, const value *fn, const uint8_t *bytes, size_t len,
           void **out_value, uint64_t *out_weight) {
  int code;
  enum ml_mode mode = ml_mode;
  if (mode == ML_OUTSIDE) return ML_FOREIGN_THREAD;
  if (mode == ML_RELEASED) caml_acquire_runtime_system();
  ml_mode = ML_OUTSIDE; /* OCaml code runs: a kcache call it makes sets its own mode */
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
        atomic_fetch_add(&mc->live, 1);
        *out_value = box;
        *out_weight = (uint64_t)Long_val(Field(built, 1));
        code = 0;
      }
    } else { /* Failed code */
      code = Int_val(Field(res, 0));
    }
    CAMLdrop;
  }
  ml_mode = mode;
  if (mode == ML_RELEASED) caml_release_runtime_system();
  return code;
}

static int ml_build(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                    uint64_t *out_weight) {
  struct ml_build_ctx *b = ctx;
  return ml_run(b->mc, b->build, key, key_len, out_value, out_weight);
}

/* A destroy runs on the thread that released the value's last lease or removed its entry:
 * ML_HELD when that was a lease's release (ml_kc_lease_release keeps the runtime lock), else
 * ML_RELEASED, and it takes the lock back. A destroy refused on a foreign thread leaves its
 * value rooted: a leak, never a crash. */
static int ml_destroy(void *ctx, void *v) {
  struct ml_cache *mc = ctx;
  value *box = v;
  enum ml_mode mode = ml_mode;
  if (mode == ML_OUTSIDE) return ML_FOREIGN_THREAD;
  if (mode == ML_RELEASED) caml_acquire_runtime_system();
  ml_mode = ML_OUTSIDE;
  value res = caml_callback2_exn(*ml_run_destroy, mc->state, *box);
  int code = Is_exception_result(res) ? 1 : Int_val(res);
  caml_remove_generational_global_root(box);
  free(box);
  ml_cache_unlive(mc);
  ml_mode = mode;
  if (mode == ML_RELEASED) caml_release_runtime_system();
  return code;
}

value ml_kc_cache_new(value vmax_entries, value vmax_weight, value vinvalidated, value vstate) {
  CAMLparam4(vmax_entries, vmax_weight, vinvalidated, vstate);
  CAMLlocal1(vcache);
  struct ml_cache *mc = malloc(sizeof *mc);
  if (mc == NULL) caml_raise_out_of_memory();
  mc->cache = NULL;
  mc->state = vstate;
  atomic_init(&mc->use, 0);
  atomic_init(&mc->live, 1);
  atomic_init(&mc->refs, 2);
  caml_register_generational_global_root(&mc->state);
  kc_cache_options opts = kc_cache_options_default();
  opts.max_entries = (uint64_t)Long_val(vmax_entries);
  opts.max_weight = (uint64_t)Long_val(vmax_weight);
  opts.invalidated_by_clear = Bool_val(vinvalidated);
  opts.destroy = ml_destroy;
  opts.destroy_ctx = mc;
  kc_status status = kc_cache_new(&opts, &mc->cache);
  if (status != KC_OK) {
    caml_remove_generational_global_root(&mc->state);
    free(mc);
    ml_raise_status(status);
  }
  vcache = caml_alloc_custom(&ml_cache_ops, sizeof(struct ml_cache *), 0, 1);
  Cache_ptr(vcache) = mc;
  CAMLreturn(vcache);
}

value ml_kc_cache_free(value vcache) {
  CAMLparam1(vcache);
  struct ml_cache *mc = Cache_ptr(vcache);
  if (ml_retire(&mc->use)) ml_cache_finish(mc);
  CAMLreturn(Val_unit);
}

value ml_kc_cache_find_or_build(value vcache, value vkey, value vdevice, value vbuild) {
  CAMLparam4(vcache, vkey, vdevice, vbuild);
  CAMLlocal1(vlease);
  uint8_t small[ML_SMALL_KEY];
  size_t len;
  uint8_t *key = ml_key_copy(vkey, small, &len);
  struct ml_cache *mc = ml_cache_enter(vcache);
  int64_t device = Long_val(vdevice);
  struct ml_build_ctx ctx = {mc, &vbuild};
  kc_lease *lease = NULL;
  kc_status status;
  ML_UNLOCKED_CALL(status,
                   kc_cache_find_or_build(mc->cache, key, len, device, ml_build, &ctx, &lease));
  ml_cache_leave(mc);
  if (key != small) free(key);
  ml_check(status);
  vlease = ml_lease_alloc(lease);
  CAMLreturn(vlease);
}


value ml_kc_cache_remove(value vcache, value vkey) {
  CAMLparam2(vcache, vkey);
  uint8_t small[ML_SMALL_KEY];
  size_t len;
  uint8_t *key = ml_key_copy(vkey, small, &len);
  struct ml_cache *mc = ml_cache_enter(vcache);
  kc_status status;
  ML_UNLOCKED_CALL(status, kc_cache_remove(mc->cache, key, len));
  ml_cache_leave(mc);
  if (key != small) free(key);
  if (status == KC_ERR_NOT_FOUND) CAMLreturn(Val_false);
  ml_check(status);
  CAMLreturn(Val_true);
}

value ml_kc_cache_evict_device(value vcache, value vdevice) {
  CAMLparam2(vcache, vdevice);
  int64_t device = Long_val(vdevice);
  struct ml_cache *mc = ml_cache_enter(vcache);
  ML_UNLOCKED_CHECKED(ml_cache_leave(mc), kc_cache_evict_device(mc->cache, device));
  CAMLreturn(Val_unit);
}

value ml_kc_cache_clear(value vcache) {
  CAMLparam1(vcache);
  struct ml_cache *mc = ml_cache_enter(vcache);
  ML_UNLOCKED_CHECKED(ml_cache_leave(mc), kc_cache_clear(mc->cache));
  CAMLreturn(Val_unit);
}

/* The calls below neither wait nor run callbacks: they keep the runtime lock, and enter the
 * cache all the same, since another domain may free it meanwhile. */

value ml_kc_cache_len(value vcache) {
  struct ml_cache *mc = ml_cache_enter(vcache);
  size_t len = kc_cache_len(mc->cache);
  ml_cache_leave(mc);
  return Val_long(len);
}

value ml_kc_cache_reset_stats(value vcache) {
  struct ml_cache *mc = ml_cache_enter(vcache);
  kc_status status = kc_cache_reset_stats(mc->cache);
  ml_cache_leave(mc);
  ml_check(status);
  return Val_unit;
}

/* The fields in the order of Kcache.stats. */
value ml_kc_cache_stats(value vcache) {
  kc_cache_statistics s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  struct ml_cache *mc = ml_cache_enter(vcache);
  kc_status status = kc_cache_stats(mc->cache, &s);
  ml_cache_leave(mc);
  ml_check(status);
  const uint64_t fields[] = {s.hits,      s.misses,          s.builds,
                             s.build_failures, s.waits,      s.discarded,
                             s.capacity_evictions, s.device_evictions, s.clears,
                             s.destroys,  s.destroy_errors,  s.entries,
                             s.weight,    s.leases};
  const size_t n = sizeof fields / sizeof fields[0];
  return ml_counters(fields, n, n);
}

/* A lease's value and weight are read by the domain that holds it, before it releases it
 * (Kcache keeps lease blocks to itself, one lookup each): no release can race them. */
static kc_lease *ml_lease_of(value vlease) {
  kc_lease *lease = atomic_load(Lease_slot(vlease));
  if (lease == NULL) caml_invalid_argument("Kcache: the lease was released");
  return lease;
}

value ml_kc_lease_value(value vlease) { return *(value *)kc_lease_value(ml_lease_of(vlease)); }

value ml_kc_lease_weight(value vlease) {
  return Val_long((intnat)kc_lease_weight(ml_lease_of(vlease)));
}

/* Releases once: the lease is taken out of its block by one exchange, so of two releases on
 * any domains one gets it and the other nothing, rather than a double free. A release never
 * waits, and the destroy it may run runs on this thread: the runtime lock stays held, and
 * ml_destroy is told so, which halves the lock traffic of a hit. */
value ml_kc_lease_release(value vlease) {
  kc_lease *lease = atomic_exchange(Lease_slot(vlease), NULL);
  if (lease == NULL) return Val_unit;
  enum ml_mode saved = ml_mode;
  ml_mode = ML_HELD;
  kc_lease_release(lease);
  ml_mode = saved;
  return Val_unit;
}

value ml_kc_version(value unit) {
  (void)unit;
  return caml_copy_string(kc_version());
}

value ml_kc_hit_rate(value vhits, value vmisses) {
  return caml_copy_double(kc_hit_rate((uint64_t)Long_val(vhits), (uint64_t)Long_val(vmisses)));
}
