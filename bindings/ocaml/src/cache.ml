(* Kcache's cache: the typed API over the C stubs (cache_stubs.c). The stubs keep the
   runtime-lock and GC-root rules; this file keeps the exception rule: a build's exception is
   caught here, stored, and raised again in the builder and in every caller that waited for
   that build. *)

module Status = Status

exception Error of Status.t * string

module Key = Key
module Disk = Disk

(* Raised by the stubs on KC_ERR_BUILD_FAILED with kc_last_build_error()'s code; never leaves
   this module. *)
exception Build_code of int

let () =
  Callback.register_exception "kcache.error" (Error (Status.Unknown, ""));
  Callback.register_exception "kcache.build_code" (Build_code 0);
  Printexc.register_printer (function
    | Error (status, msg) -> Some (Printf.sprintf "Kcache.Error(%s, %S)" (Status.to_string status) msg)
    | _ -> None)

type raw_cache
type raw_lease

(* What a build hands back to the stubs: the value and its weight, or a failure's code. *)
type built = Built of Obj.t * int | Failed of int

type failure = { code : int; exn : exn; backtrace : Printexc.raw_backtrace }

(* Failures are kept in a ring: a waiter reads its build's exception once the build returned,
   so the last [ring_size] failures are more than enough, and memory stays bounded. *)
let ring_size = 256

type 'a state = {
  weigh : ('a -> int) option;
  destroy : ('a -> unit) option;
  failures : failure option array;
  mutable next_code : int;
  lock : Mutex.t;
}

type 'a t = { raw : raw_cache; state : 'a state }

include Cache_types

external cache_new : int -> int -> bool -> 'a state -> raw_cache = "ml_kc_cache_new"
external cache_free : raw_cache -> unit = "ml_kc_cache_free"

external cache_find_or_build : raw_cache -> string -> int -> (string -> 'a) -> raw_lease
  = "ml_kc_cache_find_or_build"

(* Passed whole to ml_kc_tiered_find_or_build, which reads the fields in this order. *)
type 'a tiered = {
  t_build : string -> 'a;
  t_load : string -> 'a;
  t_serialize : 'a -> string;
  t_disk_key : string;
}

external tiered_find_or_build :
  raw_cache -> string -> int -> Disk.t option -> 'a tiered -> raw_lease
  = "ml_kc_tiered_find_or_build"

external cache_remove : raw_cache -> string -> bool = "ml_kc_cache_remove"
external cache_evict_device : raw_cache -> int -> unit = "ml_kc_cache_evict_device"
external cache_clear : raw_cache -> unit = "ml_kc_cache_clear"
external cache_len : raw_cache -> int = "ml_kc_cache_len"
external cache_stats : raw_cache -> stats = "ml_kc_cache_stats"
external cache_reset_stats : raw_cache -> unit = "ml_kc_cache_reset_stats"
external lease_value : raw_lease -> 'a = "ml_kc_lease_value"
external lease_weight : raw_lease -> int = "ml_kc_lease_weight"
external lease_release : raw_lease -> unit = "ml_kc_lease_release"
external version : unit -> string = "ml_kc_version"
external c_hit_rate : int -> int -> float = "ml_kc_hit_rate"

let with_lock st f =
  Mutex.lock st.lock;
  match f () with
  | r ->
      Mutex.unlock st.lock;
      r
  | exception e ->
      Mutex.unlock st.lock;
      raise e

(* Codes are positive and fit a C int; -1 is the stubs' own (a wrapper that raised). *)
let record_failure st exn backtrace =
  with_lock st (fun () ->
      let code = st.next_code in
      st.next_code <- (if code >= 0x3FFF_FFFF then 1 else code + 1);
      st.failures.(code mod ring_size) <- Some { code; exn; backtrace };
      code)

(* Called by the build callback, with the runtime lock held. Never raises. *)
let run_build st build key =
  match build key with
  | v -> (
      match st.weigh with
      | None -> Built (Obj.repr v, 0)
      | Some weight -> (
          match weight v with
          | w -> Built (Obj.repr v, max w 0)
          | exception e -> Failed (record_failure st e (Printexc.get_raw_backtrace ()))))
  | exception e -> Failed (record_failure st e (Printexc.get_raw_backtrace ()))

(* Called by the destroy callback, with the runtime lock held. Never raises: a destroy that
   raised is reported by kcache as KC_ERR_DESTROY_FAILED and counted in [destroy_errors]. *)
let run_destroy st v =
  match st.destroy with
  | None -> 0
  | Some destroy -> ( match destroy v with () -> 0 | exception _ -> 1)

external init : unit -> unit = "ml_kc_init"

(* The stubs look the two up once, here, before any domain can make a cache. *)
let () =
  Callback.register "kcache.run_build" run_build;
  Callback.register "kcache.run_destroy" run_destroy;
  init ()

(* The stubs' code for a callback refused on a thread OCaml does not run (ML_FOREIGN_THREAD). *)
let foreign_thread = -2

let raise_failure st code =
  let found =
    if code <= 0 then None
    else
      with_lock st (fun () ->
          match st.failures.(code mod ring_size) with
          | Some f when f.code = code -> Some f
          | _ -> None)
  in
  match found with
  | Some f -> Printexc.raise_with_backtrace f.exn f.backtrace
  | None when code = foreign_thread ->
      raise
        (Error
           ( Status.Build_failed,
             "the build was called on a thread OCaml does not run: refused, not run" ))
  | None ->
      raise (Error (Status.Build_failed, Printf.sprintf "the build failed (code %d)" code))

let create ?(max_entries = 0) ?(max_weight = 0) ?(invalidated_by_clear = false) ?weight
    ?destroy () =
  if max_entries < 0 || max_weight < 0 then
    invalid_arg "Kcache.create: a negative capacity";
  let state =
    { weigh = weight; destroy; failures = Array.make ring_size None; next_code = 1; lock = Mutex.create () }
  in
  { raw = cache_new max_entries max_weight invalidated_by_clear state; state }

let free t = cache_free t.raw

let with_cache ?max_entries ?max_weight ?invalidated_by_clear ?weight ?destroy f =
  let t = create ?max_entries ?max_weight ?invalidated_by_clear ?weight ?destroy () in
  Fun.protect ~finally:(fun () -> free t) (fun () -> f t)

let no_device = -1

let check_device device = if device < no_device then invalid_arg "Kcache: a negative device"

(* Takes a lease with [lookup], turning a build's code back into its exception. *)
let acquire t lookup = try lookup () with Build_code code -> raise_failure t.state code

(* Runs [f] under the lease and releases it however [f] returns. *)
let under lease f =
  match f (lease_value lease) (lease_weight lease) with
  | r ->
      lease_release lease;
      r
  | exception e ->
      let bt = Printexc.get_raw_backtrace () in
      lease_release lease;
      Printexc.raise_with_backtrace e bt

let with_lease_weight t ?(device = no_device) key ~build f =
  check_device device;
  under (acquire t (fun () -> cache_find_or_build t.raw key device build)) f

let with_lease_tiered t ?(device = no_device) ?disk key ~disk_key ~build ~load ~serialize f =
  check_device device;
  if String.length disk_key <> Key.length then invalid_arg "Kcache.with_lease_tiered: disk_key";
  let cbs = { t_build = build; t_load = load; t_serialize = serialize; t_disk_key = disk_key } in
  under (acquire t (fun () -> tiered_find_or_build t.raw key device disk cbs)) (fun v _ -> f v)

let with_lease t ?device key ~build f = with_lease_weight t ?device key ~build (fun v _ -> f v)
let find_or_build t ?device key ~build = with_lease t ?device key ~build Fun.id
let remove t key = cache_remove t.raw key

let evict_device t device =
  if device < 0 then invalid_arg "Kcache.evict_device: a negative device";
  cache_evict_device t.raw device

let clear t = cache_clear t.raw
let length t = cache_len t.raw
let stats t = cache_stats t.raw
let reset_stats t = cache_reset_stats t.raw
let hit_rate (s : stats) = if s.hits + s.misses = 0 then None else Some (c_hit_rate s.hits s.misses)
