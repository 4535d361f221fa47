(** Keys for the disk tier: a digest of everything that decides what a compiler produces
    (kcache's key builder). Two processes that make a key from the same inputs get the same
    key, and any differing input gives another. *)

val length : int
(** A key's length in bytes: 32. *)

val make :
  ?backend:string ->
  ?device_name:string ->
  ?device_vendor:string ->
  ?driver_version:string ->
  ?compiler_version:string ->
  ?entry:string ->
  ?source:string ->
  ?options:(string * string) list ->
  ?ordered_options:string list ->
  ?extras:(string * string) list ->
  ?dependencies:(string * string) list ->
  unit ->
  string
(** The key of these inputs. An unset field differs from an empty one. [options] (name,
    value; a flag has an empty value), [extras] (free-form inputs) and [dependencies] (a file
    the compiler reads, by name and contents) are sorted by name, so their order does not
    matter, and a name given twice raises [Kcache.Error (Invalid_argument, _)].
    [ordered_options] are command-line arguments hashed in the order given: use them for
    options that interact by position ([-DX=1] then [-UX], [-I] paths). *)

val to_hex : string -> string
(** A key in hexadecimal, for messages. *)
