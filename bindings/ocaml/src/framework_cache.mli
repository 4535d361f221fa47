(** An on-disk cache of compiled kernels with the interface of a framework's own disk cache
    ([get], [put], [compute_key], statistics, a trusted directory, [write_atomically]), so a
    framework moves to kcache by changing a module path. Entries go to kcache's disk tier
    ({!Kcache.Disk}): each one checksummed, or authenticated when an operator key is set
    ([KCACHE_KEY_FILE], …), verified on every read (a tampered entry is a miss, and removed),
    bounded by the tier's size cap, shared with every other kcache user of the directory and
    shown by [kcache stats]. Safe on OCaml 5 domains and on systhreads; the counters are
    exact under both. *)

val debug_enabled : bool
(** Whether {!debugf} writes: [KCACHE_LOG=debug] (any case), kcache's own debug level, read
    once when the program starts. *)

val debugf : ('a, out_channel, unit, unit, unit, unit) format6 -> 'a
(** Writes one line [kcache: debug: ...] on standard error when {!debug_enabled}, else
    nothing (the arguments are still evaluated). *)

val warnf : ('a, out_channel, unit, unit, unit, unit) format6 -> 'a
(** Writes one line [kcache: ...] on standard error. *)

type stats = {
  mutable hits : int;  (** lookups that found a verified entry *)
  mutable misses : int;  (** lookups that found none *)
  mutable puts : int;  (** entries written *)
  mutable errors : int;  (** lookups and writes the tier failed *)
}

val stats : stats
(** The process's counters, updated under a lock. Read a consistent copy with
    {!get_stats}. *)

val get_stats : unit -> stats
(** A copy of the counters, taken at once. *)

val reset_stats : unit -> unit
val hit_rate : unit -> float
(** [hits / (hits + misses)], 0.0 before the first lookup. *)

val print_stats : unit -> unit
(** Prints the counters and the hit rate on standard output. *)

val cache_dir_name : string
(** ["kcache"]: the directory's name under [$XDG_CACHE_HOME] or [$HOME/.cache]. *)

val enabled : unit -> bool
(** Whether the cache is on, read from the environment on every call, so that a test or a
    wrapper script can switch it per process: on unless [SAREK_DISK_CACHE=0] (exactly ["0"],
    the variable of the cache this module replaces) or [KCACHE_DISABLE=1] (kcache's own).
    When off, {!get} is a miss that touches neither the disk nor the counters, and {!put}
    writes nothing. *)

val get_cache_dir : unit -> string
(** The directory, created (mode 0700) if missing: [KCACHE_DIR] if set to an absolute path,
    else [$XDG_CACHE_HOME/kcache], else [$HOME/.cache/kcache]; relative or empty values are
    ignored. When none is set, the last resort: [kcache] in the shared temporary directory
    ([Filename.get_temp_dir_name]), which {!trusted_dir} refuses. Raises [Unix.Unix_error]
    when it cannot be created. *)

val untrusted_warned : bool Atomic.t
(** Whether {!warn_untrusted} has written its warning in this process. *)

val warn_untrusted : ('a, out_channel, unit, unit, unit, unit) format6 -> 'a
(** {!warnf} the first time in the process, nothing after: the warning that the directory is
    refused, written once however many lookups find it refused. *)

val trusted_dir : unit -> string option
(** {!get_cache_dir} when entries may be read from and written to it, or [None]: no
    directory can be named (no [KCACHE_DIR], [XDG_CACHE_HOME] or [HOME]: the shared temporary
    directory is never trusted, and is not made), it cannot be created, it is not a directory
    owned by this user, or group or others may write to it. Cached kernels are native code a
    driver loads, so a directory another user can write would let them substitute it. Each
    refusal goes to {!warn_untrusted}: the first one is written, once per process. *)

val key_schema_version : string
(** The version of the key's inputs, the prefix of every key: a change of what keys hold
    changes it, so entries written under another schema are never hit (they are orphans the
    size cap removes). *)

val compute_key_with_options :
  options:(string * string) list ->
  dev_name:string ->
  driver_version:string ->
  name:string ->
  source:string ->
  string
(** The key of one compile: the device's name and driver version (not its position in an
    enumeration, which changes between runs), the entry point's name (one source may define
    several kernels), the source and the build options, in their order. Each field is
    digested on its own ({!Kcache.Key.make}), so no bytes can move from one field to
    another. *)

val compute_key : dev_name:string -> driver_version:string -> name:string -> source:string -> string
(** {!compute_key_with_options} with no options. *)

val get : key:string -> string option
(** The entry for [key], verified; [None] when there is none, when it failed verification,
    when the cache is off ({!enabled}) or when the directory is not trusted ({!trusted_dir}). *)

val put : key:string -> data:string -> unit
(** Writes the entry for [key], atomically (a reader sees the previous entry or this one,
    whole) and durably. Nothing when the cache is off or the directory is not trusted; a
    failed write is counted in [errors], never raised. *)

val write_atomically : dir:string -> filename:string -> string -> unit
(** Writes the bytes to a fresh temporary file in [dir] (created exclusively, with a random
    name, so concurrent writers never share one), flushes it to the disk and renames it onto
    [filename]: a reader sees the previous file or the new one, whole. Raises [Sys_error] or
    [Unix.Unix_error] when a step fails, leaving no temporary file behind. *)
