/* The disk tier (kc_persistence_*) and the tiered lookup (kc_tiered_find_or_build). Disk calls do
 * I/O and a tiered lookup runs callbacks: all of them run with the runtime lock released, on
 * copies of the keys and data. */
#include "ml_kcache.h"

/* One OCaml disk; `use` as in struct ml_cache. The struct lives as long as the custom block
 * that points at it, so a domain holding the block never reads freed memory. */
struct ml_disk {
  kc_persistence *disk;
  atomic_intptr_t use;
};

#define Disk_ptr(v) (*(struct ml_disk **)Data_custom_val(v))

/* Frees the struct only: freeing the disk tier waits for its background writes, which
 * Kcache.Disk.free does with the runtime lock released, never a finalizer. */
static void ml_disk_finalize(value vdisk) { free(Disk_ptr(vdisk)); }

static struct custom_operations ml_disk_ops = {
    "kcache.disk",           ml_disk_finalize,           custom_compare_default,
    custom_hash_default,     custom_serialize_default,   custom_deserialize_default,
    custom_compare_ext_default, custom_fixed_length_default};

/* Frees the disk tier, waiting for its background writes with the runtime lock released. */
static void ml_disk_finish(struct ml_disk *md) { ML_UNLOCKED(kc_persistence_free(md->disk)); }

/* Leaves a call on the disk, carrying its free out if it was freed meanwhile and this was the
 * last call. */
static void ml_disk_leave(struct ml_disk *md) {
  if (ml_leave(&md->use)) ml_disk_finish(md);
}

/* The disk of a Kcache.Disk.t, entered, or NULL (nothing entered) once it was freed. */
static struct ml_disk *ml_disk_try_enter(value vdisk) {
  struct ml_disk *md = Disk_ptr(vdisk);
  int entered = ml_enter(&md->use);
  if (entered < 0) ml_disk_finish(md);
  return entered > 0 ? md : NULL;
}

/* ml_disk_try_enter, raising Invalid_argument once the disk was freed. */
static struct ml_disk *ml_disk_enter(value vdisk) {
  struct ml_disk *md = ml_disk_try_enter(vdisk);
  if (md == NULL) caml_invalid_argument("Kcache.Disk: the disk was freed");
  return md;
}

/* A disk key: exactly KC_KEY_LEN bytes, copied to `out`. */
static void ml_disk_key(value vkey, uint8_t *out) {
  if (caml_string_length(vkey) != KC_KEY_LEN)
    caml_invalid_argument("Kcache.Disk: a disk key is 32 bytes (Kcache.Key.make)");
  memcpy(out, String_val(vkey), KC_KEY_LEN);
}

/* `vopts` is a Kcache.Disk options record: dir, max_size, key, relaxed_durability,
 * ignore_env, require_key, lock_timeout_ms. kc_persistence_open neither waits nor runs callbacks and
 * copies what it keeps, so OCaml strings are passed straight through, the lock held. */
value ml_kc_persistence_open(value vopts) {
  CAMLparam1(vopts);
  CAMLlocal1(vdisk);
  kc_persistence_options opts = kc_persistence_options_default();
  value vdir = Field(vopts, 0), vkey = Field(vopts, 2);
  if (Is_block(vdir)) {
    if (!caml_string_is_c_safe(Field(vdir, 0)))
      caml_invalid_argument("Kcache.Disk.create: a NUL byte in dir");
    opts.dir = String_val(Field(vdir, 0));
  }
  opts.max_size = (uint64_t)Long_val(Field(vopts, 1));
  if (Is_block(vkey)) {
    opts.key = (const uint8_t *)String_val(Field(vkey, 0));
    opts.key_len = caml_string_length(Field(vkey, 0));
  }
  opts.relaxed_durability = Bool_val(Field(vopts, 3));
  opts.ignore_env = Bool_val(Field(vopts, 4));
  opts.require_key = Bool_val(Field(vopts, 5));
  opts.lock_timeout_ms = (uint64_t)Long_val(Field(vopts, 6));
  struct ml_disk *md = malloc(sizeof *md);
  if (md == NULL) caml_raise_out_of_memory();
  atomic_init(&md->use, 0);
  kc_status status = kc_persistence_open(&opts, &md->disk);
  if (status != KC_OK) {
    free(md);
    ml_raise_status(status);
  }
  vdisk = caml_alloc_custom(&ml_disk_ops, sizeof(struct ml_disk *), 0, 1);
  Disk_ptr(vdisk) = md;
  CAMLreturn(vdisk);
}

value ml_kc_persistence_free(value vdisk) {
  struct ml_disk *md = Disk_ptr(vdisk);
  if (ml_retire(&md->use)) ml_disk_finish(md);
  return Val_unit;
}

value ml_kc_persistence_put(value vdisk, value vkey, value vdata) {
  CAMLparam3(vdisk, vkey, vdata);
  uint8_t key[KC_KEY_LEN];
  ml_disk_key(vkey, key);
  size_t len = caml_string_length(vdata);
  uint8_t *data = malloc(len > 0 ? len : 1);
  if (data == NULL) caml_raise_out_of_memory();
  memcpy(data, String_val(vdata), len);
  struct ml_disk *md = ml_disk_enter(vdisk);
  kc_status status;
  ML_UNLOCKED_CALL(status, kc_persistence_put(md->disk, key, data, len, 0));
  ml_disk_leave(md);
  free(data);
  ml_check(status);
  CAMLreturn(Val_unit);
}

/* Some payload, or None for a miss (no entry, or one that failed verification and was
 * removed). */
value ml_kc_persistence_get(value vdisk, value vkey) {
  CAMLparam2(vdisk, vkey);
  CAMLlocal2(vdata, vsome);
  uint8_t key[KC_KEY_LEN];
  ml_disk_key(vkey, key);
  kc_buffer buf;
  memset(&buf, 0, sizeof buf);
  struct ml_disk *md = ml_disk_enter(vdisk);
  kc_status status;
  ML_UNLOCKED_CALL(status, kc_persistence_get(md->disk, key, &buf));
  ml_disk_leave(md);
  if (status == KC_ERR_NOT_FOUND || status == KC_ERR_INTEGRITY) CAMLreturn(Val_none);
  ml_check(status);
  vdata = caml_alloc_initialized_string(buf.len, (const char *)buf.data);
  kc_buffer_free(&buf);
  vsome = caml_alloc_some(vdata);
  CAMLreturn(vsome);
}

value ml_kc_persistence_remove(value vdisk, value vkey) {
  CAMLparam2(vdisk, vkey);
  uint8_t key[KC_KEY_LEN];
  ml_disk_key(vkey, key);
  struct ml_disk *md = ml_disk_enter(vdisk);
  kc_status status;
  ML_UNLOCKED_CALL(status, kc_persistence_remove(md->disk, key));
  ml_disk_leave(md);
  if (status == KC_ERR_NOT_FOUND) CAMLreturn(Val_false);
  ml_check(status);
  CAMLreturn(Val_true);
}

value ml_kc_persistence_flush(value vdisk) {
  CAMLparam1(vdisk);
  struct ml_disk *md = ml_disk_enter(vdisk);
  ML_UNLOCKED_CHECKED(ml_disk_leave(md), kc_persistence_flush(md->disk));
  CAMLreturn(Val_unit);
}

value ml_kc_persistence_reset_stats(value vdisk) {
  struct ml_disk *md = ml_disk_enter(vdisk);
  kc_status status = kc_persistence_reset_stats(md->disk);
  ml_disk_leave(md);
  ml_check(status);
  return Val_unit;
}

/* The fields in the order of Kcache.Disk.stats. */
value ml_kc_persistence_stats(value vdisk) {
  kc_persistence_statistics s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  struct ml_disk *md = ml_disk_enter(vdisk);
  kc_status status = kc_persistence_stats(md->disk, &s);
  ml_disk_leave(md);
  ml_check(status);
  const uint64_t fields[] = {s.hits,          s.misses,         s.puts,
                             s.bytes_read,    s.bytes_written,  s.integrity_rejects,
                             s.io_errors,     s.evictions,      s.removes,
                             s.load_failures, s.entries,        s.bytes,
                             s.lock_waits,    s.lock_timeouts,  s.lock_takeovers,
                             s.pending_writes, s.failed_writes};
  const size_t n = sizeof fields / sizeof fields[0];
  value vstats = ml_counters(fields, n, n + 1);
  Store_field(vstats, n, Val_bool(s.scan_complete));
  return vstats;
}

/* What the tiered callbacks need: each points at a local root of the calling stub. `bytes`
 * holds serialize's result between its two calls. */
struct ml_tiered_ctx {
  struct ml_cache *mc;
  value *build;
  value *load;
  value *serialize;
  value *bytes;
};

static int ml_tiered_build(void *ctx, const uint8_t *key, size_t key_len, void **out_value,
                           uint64_t *out_weight) {
  struct ml_tiered_ctx *t = ctx;
  return ml_run(t->mc, t->build, key, key_len, out_value, out_weight);
}

static int ml_tiered_load(void *ctx, const uint8_t *bytes, size_t len, void **out_value,
                          uint64_t *out_weight) {
  struct ml_tiered_ctx *t = ctx;
  return ml_run(t->mc, t->load, bytes, len, out_value, out_weight);
}

/* First call: runs the OCaml serialize and keeps its string; second: copies it out. An
 * exception from serialize skips the write-back, as a non-zero return is documented to. */
static int ml_tiered_serialize(void *ctx, void *v, uint8_t *buf, size_t *len) {
  struct ml_tiered_ctx *t = ctx;
  int code = 0;
  enum ml_mode mode = ml_mode;
  if (mode == ML_OUTSIDE) return ML_FOREIGN_THREAD;
  if (mode == ML_RELEASED) caml_acquire_runtime_system();
  ml_mode = ML_OUTSIDE;
  if (buf == NULL) {
    value res = caml_callback_exn(*t->serialize, *(value *)v);
    if (Is_exception_result(res)) {
      code = 1;
    } else {
      *t->bytes = res;
      *len = caml_string_length(res);
    }
  } else if (Is_block(*t->bytes) && caml_string_length(*t->bytes) <= *len) {
    *len = caml_string_length(*t->bytes);
    memcpy(buf, String_val(*t->bytes), *len);
  } else {
    code = 1;
  }
  ml_mode = mode;
  if (mode == ML_RELEASED) caml_release_runtime_system();
  return code;
}

/* `vdisk` is a disk option; `vcbs` the record { build; load; serialize; disk_key }. */
value ml_kc_tiered_find_or_build(value vcache, value vkey, value vdevice, value vdisk,
                                 value vcbs) {
  CAMLparam5(vcache, vkey, vdevice, vdisk, vcbs);
  CAMLlocal5(vbuild, vload, vserialize, vbytes, vlease);
  uint8_t l2_key[KC_KEY_LEN];
  ml_disk_key(Field(vcbs, 3), l2_key);
  vbuild = Field(vcbs, 0);
  vload = Field(vcbs, 1);
  vserialize = Field(vcbs, 2);
  vbytes = Val_unit;
  kc_tiered_callbacks cbs;
  memset(&cbs, 0, sizeof cbs);
  cbs.struct_size = sizeof cbs;
  cbs.build = ml_tiered_build;
  cbs.load = ml_tiered_load;
  cbs.serialize = ml_tiered_serialize;
  uint8_t small[ML_SMALL_KEY];
  size_t len;
  uint8_t *key = ml_key_copy(vkey, small, &len);
  int64_t device = Long_val(vdevice);
  /* Both handles entered, or neither (and the key's copy freed) before raising. */
  struct ml_cache *mc = ml_cache_try_enter(vcache);
  struct ml_disk *md = Is_block(vdisk) ? ml_disk_try_enter(Field(vdisk, 0)) : NULL;
  int disk_entered = !Is_block(vdisk) || md != NULL;
  if (mc == NULL || !disk_entered) {
    if (mc != NULL) ml_cache_leave(mc);
    if (md != NULL) ml_disk_leave(md);
    if (key != small) free(key);
    caml_invalid_argument(mc == NULL ? "Kcache: the cache was freed"
                                     : "Kcache.Disk: the disk was freed");
  }
  struct ml_tiered_ctx ctx = {mc, &vbuild, &vload, &vserialize, &vbytes};
  cbs.ctx = &ctx;
  kc_lease *lease = NULL;
  kc_status status;
  kc_persistence *tiers = md != NULL ? md->disk : kc_persistence_none();
  ML_UNLOCKED_CALL(status,
                   kc_tiered_find_or_build(mc->cache, key, len, device, tiers, l2_key, &cbs, &lease));
  ml_cache_leave(mc);
  if (md != NULL) ml_disk_leave(md);
  if (key != small) free(key);
  ml_check(status);
  vlease = ml_lease_alloc(lease);
  CAMLreturn(vlease);
}
