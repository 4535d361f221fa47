(* The types of Kcache.Disk's interface, without an interface of their own: disk.ml includes
   them and disk.mli includes their signature, so that neither repeats them. *)

(** A function that takes a tier's options, then ['r]: {!Kcache.Disk.create} and
    {!Kcache.Disk.with_disk}. [dir] is an absolute path (default from [KCACHE_DIR], then the
    XDG cache directory); [max_size] caps the tier in bytes (0: [KCACHE_MAX_SIZE], else
    1 GiB); [key] is an operator key of 16 to 4096 bytes; the other options are those of
    [kc_persistence_options]. *)
type 'r with_options =
  ?dir:string ->
  ?max_size:int ->
  ?key:string ->
  ?relaxed_durability:bool ->
  ?ignore_env:bool ->
  ?require_key:bool ->
  ?lock_timeout_ms:int ->
  'r

(** The counters of [kc_persistence_statistics], in the order the stubs store them. *)
type stats = {
  hits : int;
  misses : int;
  puts : int;
  bytes_read : int;
  bytes_written : int;
  integrity_rejects : int;
  io_errors : int;
  evictions : int;
  removes : int;
  load_failures : int;  (** entries a tiered lookup's [load] refused, removed *)
  entries : int;
  bytes : int;
  lock_waits : int;
  lock_timeouts : int;
  lock_takeovers : int;
  pending_writes : int;
  failed_writes : int;
  scan_complete : bool;
}
