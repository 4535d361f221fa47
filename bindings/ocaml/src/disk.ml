(* The disk tier (the kc_persistence functions): entries in a directory, verified on every read. *)

type t

(* Passed whole to ml_kc_persistence_open, which reads the fields in this order. *)
type options = {
  dir : string option;
  max_size : int;
  key : string option;
  relaxed_durability : bool;
  ignore_env : bool;
  require_key : bool;
  lock_timeout_ms : int;
}

include Disk_types

external disk_new : options -> t = "ml_kc_persistence_open"
external free : t -> unit = "ml_kc_persistence_free"
external put : t -> string -> string -> unit = "ml_kc_persistence_put"
external get : t -> string -> string option = "ml_kc_persistence_get"
external remove : t -> string -> bool = "ml_kc_persistence_remove"
external flush : t -> unit = "ml_kc_persistence_flush"
external stats : t -> stats = "ml_kc_persistence_stats"
external reset_stats : t -> unit = "ml_kc_persistence_reset_stats"

let create ?dir ?(max_size = 0) ?key ?(relaxed_durability = false) ?(ignore_env = false)
    ?(require_key = false) ?(lock_timeout_ms = 0) () =
  if max_size < 0 || lock_timeout_ms < 0 then invalid_arg "Kcache.Disk.create: a negative size or timeout";
  disk_new { dir; max_size; key; relaxed_durability; ignore_env; require_key; lock_timeout_ms }

let with_disk ?dir ?max_size ?key ?relaxed_durability ?ignore_env ?require_key ?lock_timeout_ms f =
  let d = create ?dir ?max_size ?key ?relaxed_durability ?ignore_env ?require_key ?lock_timeout_ms () in
  Fun.protect ~finally:(fun () -> free d) (fun () -> f d)
