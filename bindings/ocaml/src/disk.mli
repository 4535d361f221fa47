(** The disk tier: entries in a cache directory, written atomically and verified on every read
    (checksummed, or authenticated with an operator key). Share one across caches and
    processes; see docs/disk-tier.md for the directory's rules. Calls release the runtime
    lock while they do I/O. *)

type t

val create :
  ?dir:string ->
  ?max_size:int ->
  ?key:string ->
  ?relaxed_durability:bool ->
  ?ignore_env:bool ->
  ?require_key:bool ->
  ?lock_timeout_ms:int ->
  unit ->
  t
(** Opens the tier in [dir] (an absolute path; default from [KCACHE_DIR], then the XDG cache
    directory). [max_size] caps it in bytes (0: [KCACHE_MAX_SIZE], else 1 GiB); [key] is an
    operator key of 16 to 4096 bytes; the other arguments are those of [kc_persistence_options].
    Raises [Kcache.Error] when the tier is refused ([Unavailable], [Untrusted],
    [Invalid_argument], [Io]): a program should then go on with memory only. Free it with
    {!free} (or use {!with_disk}). *)

val free : t -> unit
(** Writes what is pending and closes the tier; a second [free] does nothing, other calls
    after it raise [Invalid_argument]. *)

val with_disk :
  ?dir:string ->
  ?max_size:int ->
  ?key:string ->
  ?relaxed_durability:bool ->
  ?ignore_env:bool ->
  ?require_key:bool ->
  ?lock_timeout_ms:int ->
  (t -> 'a) ->
  'a
(** [with_disk f] opens a tier, runs [f] on it and frees it, however [f] returns. *)

val put : t -> string -> string -> unit
(** [put d key payload] writes the entry for [key] (32 bytes, from {!Key.make}). *)

val get : t -> string -> string option
(** The verified payload for [key], or [None]: no entry, or one that failed verification
    (removed). *)

val remove : t -> string -> bool
(** Removes the entry for [key]; false if there was none. *)

val flush : t -> unit
(** Waits for every background write submitted so far (tiered lookups write in the
    background). *)

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
(** The counters of [kc_persistence_statistics]. *)

val stats : t -> stats
val reset_stats : t -> unit
