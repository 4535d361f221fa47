(* Kcache.Guarded_cache: a framework's mutex-guarded kernel table, as Cache underneath. What
   the table did by hand (a lock around lookups, the build outside it, a double-check, device
   epochs, clear generations) Cache does; what is left here is the interface: keys of any
   type, the two exceptions, and a failing destroy raised again as itself, not as
   Error (Destroy_failed, _). *)

exception Device_destroyed_during_build
exception Cache_cleared_during_build

type failure = { exn : exn; backtrace : Printexc.raw_backtrace }

(* [failed] holds, per thread, the first exception a destroy raised during that thread's
   current call: destroys run on the thread whose call removed the value or ended its last
   lease, so the call that ran them is the one to raise it. *)
type ('k, 'v) t = { cache : 'v Cache.t; failed : (int, failure) Hashtbl.t; lock : Mutex.t }

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
  let destroy v =
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
  { cache = Cache.create ~invalidated_by_clear ~destroy (); failed; lock }

let free t = Cache.free t.cache

(* Equal bytes for keys equal as data; no sharing, so that how a key was built does not
   matter, only what it holds. *)
let key_bytes key = Marshal.to_string key [ Marshal.No_sharing ]

let with_value t ~key ?device_id build f =
  let device =
    match device_id with
    | Some d when d < 0 -> invalid_arg "Kcache.Guarded_cache: a negative device_id"
    | d -> d
  in
  let key = key_bytes key in
  (* Only the lookup's own failures are translated, not what [f] raises. *)
  let running_f = ref false in
  match
    Cache.with_lease t.cache ?device key ~build:(fun _ -> build ()) (fun v ->
        running_f := true;
        f v)
  with
  | r ->
      (* A destroy run by this call (a value discarded, a lease that ended last) was counted;
         the value or exception the caller gets is what says how the lookup went. *)
      ignore (take t);
      r
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
