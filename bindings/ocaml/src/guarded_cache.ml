(* Kcache.Guarded_cache: a framework's mutex-guarded kernel table, as Cache underneath. What
   the table did by hand (a lock around lookups, the build outside it, a double-check, device
   epochs, clear generations) Cache does; what is left here is the interface: keys of any
   type, the two exceptions, and a failing destroy raised again as itself, not as
   Error (Destroy_failed, _). *)

exception Device_destroyed_during_build
exception Cache_cleared_during_build

type failure = { exn : exn; backtrace : Printexc.raw_backtrace }

(* A build this thread is running for [key] (its bytes), and the value a lookup of that key
   made inside it (a nested build), if one did. *)
type 'v frame = { key : string; mutable inner : 'v option }

(* [failed] holds, per thread, the first exception a destroy raised during that thread's
   current call: destroys run on the thread whose call removed the value or ended its last
   lease, so the call that ran them is the one to raise it. [building] holds, per thread, the
   builds it is running, innermost first. *)
type ('k, 'v) t = {
  cache : 'v Cache.t;
  failed : (int, failure) Hashtbl.t;
  building : (int, 'v frame list) Hashtbl.t;
  destroy : 'v -> unit;
  lock : Mutex.t;
}

let locked lock f =
  Mutex.lock lock;
  Fun.protect ~finally:(fun () -> Mutex.unlock lock) f

let self () = Thread.id (Thread.self ())

let take t =
  locked t.lock (fun () ->
      let id = self () in
      let found = Hashtbl.find_opt t.failed id in
      Hashtbl.remove t.failed id;
      found)

let create ?size:_ ?(invalidated_by_clear = false) ~destroy () =
  let failed = Hashtbl.create 8 and lock = Mutex.create () in
  let counted_destroy v =
    match destroy v with
    | () -> ()
    | exception exn ->
        let backtrace = Printexc.get_raw_backtrace () in
        locked lock (fun () ->
            let id = self () in
            if not (Hashtbl.mem failed id) then Hashtbl.replace failed id { exn; backtrace });
        (* Counted by kcache in destroy_errors. *)
        Printexc.raise_with_backtrace exn backtrace
  in
  let raw_destroy = destroy and destroy = counted_destroy in
  {
    cache = Cache.create ~invalidated_by_clear ~destroy ();
    failed;
    building = Hashtbl.create 8;
    destroy = raw_destroy;
    lock;
  }

let free t = Cache.free t.cache

(* Equal bytes for keys equal as data; no sharing, so that how a key was built does not
   matter, only what it holds. *)
let key_bytes key = Marshal.to_string key [ Marshal.No_sharing ]

(* This thread's builds, innermost first. *)
let frames t = locked t.lock (fun () -> Option.value (Hashtbl.find_opt t.building (self ())) ~default:[])

let set_frames t frames =
  locked t.lock (fun () ->
      match frames with
      | [] -> Hashtbl.remove t.building (self ())
      | frames -> Hashtbl.replace t.building (self ()) frames)

(* Runs [build] as this thread's innermost build of [key]. The value is the one a nested
   lookup of the key made inside it, if one did: that one stands as installed before this
   build ends, so this build's own value is the loser, passed to [destroy] (a failure
   dropped, as for every value discarded). [Error] when [build] raised: the exception, with the
   nested value if there was one. *)
let run_build t key build =
  let frame = { key; inner = None } in
  let outer = frames t in
  set_frames t (frame :: outer);
  let result = match build () with v -> Ok v | exception e -> Error (e, Printexc.get_raw_backtrace ()) in
  set_frames t outer;
  match (result, frame.inner) with
  | Ok own, Some installed ->
      (try t.destroy own with _ -> ());
      Ok installed
  | Ok v, None -> Ok v
  | Error failure, inner -> Error (failure, inner)

(* A lookup of [key] inside this thread's own build of it: kcache refuses it (the key is in
   flight for this very thread), and the seed's table made it an ordinary miss. So it is one
   here: the value a nested lookup made already, or a build of its own, which then stands as
   the installed value for the enclosing build (see [run_build]). *)
let nested t frame build =
  match frame.inner with
  | Some v -> v
  | None -> (
      match run_build t frame.key build with
      | Ok v ->
          frame.inner <- Some v;
          v
      | Error ((e, backtrace), inner) ->
          frame.inner <- inner;
          Printexc.raise_with_backtrace e backtrace)

let with_value t ~key ?device_id build f =
  let device =
    match device_id with
    | Some d when d < 0 -> invalid_arg "Kcache.Guarded_cache: a negative device_id"
    | d -> d
  in
  let key = key_bytes key in
  let built = ref false and raised = ref None in
  let build_here _ =
    built := true;
    match run_build t key build with
    | Ok v -> v
    | Error (failure, Some installed) ->
        (* As in the seed's table, the nested lookup's value is installed all the same; this
           caller gets the exception once it is. *)
        raised := Some failure;
        installed
    | Error ((e, backtrace), None) -> Printexc.raise_with_backtrace e backtrace
  in
  (* Only the lookup's own failures are translated, not what [f] raises. *)
  let running_f = ref false in
  match
    Cache.with_lease t.cache ?device key ~build:build_here (fun v ->
        match !raised with
        | Some (e, backtrace) -> Printexc.raise_with_backtrace e backtrace
        | None ->
            running_f := true;
            f v)
  with
  | r ->
      (* A destroy run by this call (a value discarded, a lease that ended last) was counted;
         the value or exception the caller gets is what says how the lookup went. *)
      ignore (take t);
      r
  | exception (Cache.Error (Status.Reentrant, _) as e) when not (!built || !running_f) -> (
      (* kcache refused the lookup: this thread is building the key. Looked up only here, so
         that no other lookup pays for it. *)
      let backtrace = Printexc.get_raw_backtrace () in
      ignore (take t);
      match List.find_opt (fun frame -> frame.key = key) (frames t) with
      | Some frame -> f (nested t frame build)
      | None -> Printexc.raise_with_backtrace e backtrace)
  | exception e ->
      let backtrace = Printexc.get_raw_backtrace () in
      ignore (take t);
      let e =
        match e with
        | _ when !running_f -> e
        | Cache.Error (Status.Device_destroyed, _) -> Device_destroyed_during_build
        | Cache.Error (Status.Cache_cleared, _) -> Cache_cleared_during_build
        | e -> e
      in
      Printexc.raise_with_backtrace e backtrace

let find_or_build t ~key ?device_id build = with_value t ~key ?device_id build Fun.id

(* Runs [op]; every destroy it runs is attempted, and the first that raised raises again. *)
let raising_first_failure t op =
  let reported = match op () with () -> None | exception (Cache.Error (Status.Destroy_failed, _) as e) -> Some e in
  match (take t, reported) with
  | Some f, _ -> Printexc.raise_with_backtrace f.exn f.backtrace
  | None, Some e -> raise e
  | None, None -> ()

let evict_device t device = raising_first_failure t (fun () -> Cache.evict_device t.cache device)
let clear t = raising_first_failure t (fun () -> Cache.clear t.cache)
let length t = Cache.length t.cache
let stats t = Cache.stats t.cache
