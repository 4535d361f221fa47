(* The binding under parallel workers (Par: domains on OCaml 5, systhreads on OCaml 4):
   lookups, removes, evictions and clears racing one another, then a free racing lookups, on
   a cache and on a disk. Every value is destroyed exactly once and never while a lease holds
   it; a call that loses the race to a free raises Invalid_argument, never crashes. One lookup
   in five names no device: such a lookup never fails for another caller's eviction (the seed's
   rule: each caller is judged on its own window). The figures (workers, lookups, seconds) are
   printed, not asserted. *)

open Check

type v = { alive : bool Atomic.t }

let workers = 4
let rounds = 20
let keys = 64
let per_round = 3200

(* Counted across workers. *)
let built = Atomic.make 0
let destroyed = Atomic.make 0
let destroyed_twice = Atomic.make 0
let used_dead = Atomic.make 0
let failed_builds = Atomic.make 0
let device_errors_without_device = Atomic.make 0

let destroy v =
  if not (Atomic.compare_and_set v.alive true false) then Atomic.incr destroyed_twice;
  Atomic.incr destroyed

let build _ =
  Atomic.incr built;
  { alive = Atomic.make true }

let use v = if not (Atomic.get v.alive) then Atomic.incr used_dead

(* Builds in flight when their device is evicted or the cache cleared fail so: expected. *)
let tolerating_invalidation f =
  try f ()
  with Kcache.Error ((Kcache.Status.Device_destroyed | Kcache.Status.Cache_cleared), _) ->
    Atomic.incr failed_builds

(* One worker's rounds: mostly lookups under a lease, with removes, evictions and clears. *)
let churn c w () =
  let n = ref 0 in
  for _ = 1 to rounds do
    for i = 0 to per_round - 1 do
      let key = string_of_int (((i * 7) + w) mod keys) in
      let device = i mod 4 in
      match i mod 101 with
      | 0 -> ignore (Kcache.remove c key)
      | 1 when w = 0 -> Kcache.evict_device c device
      | 2 when w = 1 -> Kcache.clear c
      | _ when i mod 5 = 4 -> (
          incr n;
          try Kcache.with_lease c key ~build use with
          | Kcache.Error (Kcache.Status.Device_destroyed, _) ->
              Atomic.incr device_errors_without_device
          | Kcache.Error (Kcache.Status.Cache_cleared, _) -> Atomic.incr failed_builds)
      | _ ->
          incr n;
          tolerating_invalidation (fun () -> Kcache.with_lease c ~device key ~build use)
    done
  done;
  !n

(* Calls made by workers racing a free, counted as they go. *)
let racing = Atomic.make 0

(* Runs [call i] for i = 0, 1, ... until the handle is freed under it (Invalid_argument). *)
let until_freed call () =
  let rec go i =
    match call i with
    | () ->
        Atomic.incr racing;
        go (i + 1)
    | exception Invalid_argument _ -> ()
  in
  go 0

(* Starts [workers] workers on [call], frees with [free] once they are well under way, and
   waits for them all to stop: the calls they made. *)
let free_racing call free =
  Atomic.set racing 0;
  let ws = List.init workers (fun w -> Par.spawn (until_freed (call w))) in
  while Atomic.get racing < 2000 do
    Thread.yield ()
  done;
  free ();
  List.iter Par.join ws;
  Atomic.get racing

let test_cache () =
  let c = Kcache.create ~max_entries:32 ~destroy () in
  let t0 = Unix.gettimeofday () in
  let ws = List.init workers (fun w -> Par.spawn (churn c w)) in
  let done_ = List.fold_left (fun acc p -> acc + Par.join p) 0 ws in
  let churned = Unix.gettimeofday () -. t0 in
  check_int "no lease left after the churn" 0 (Kcache.stats c).leases;
  check_int "no device error for a lookup without a device" 0
    (Atomic.get device_errors_without_device);
  check_int "destroys = builds - live entries" (Atomic.get built - Kcache.length c)
    (Atomic.get destroyed);
  (* A free racing lookups: it takes effect when the calls running return, and each worker
     stops at the Invalid_argument of a freed cache. *)
  let after =
    free_racing
      (fun w i ->
        tolerating_invalidation (fun () ->
            Kcache.with_lease c (string_of_int ((i + w) mod keys)) ~build use))
      (fun () -> Kcache.free c)
  in
  check "calls on the freed cache raise Invalid_argument"
    (match Kcache.length c with _ -> false | exception Invalid_argument _ -> true);
  Kcache.free c;
  check_int "every value destroyed once" (Atomic.get built) (Atomic.get destroyed);
  check_int "no value destroyed twice" 0 (Atomic.get destroyed_twice);
  check_int "no value used after its destroy" 0 (Atomic.get used_dead);
  Printf.printf
    "%s: %d workers x %d rounds: %d lookups (%d builds, %d invalidated builds) in %.2f s; \
     then %d lookups racing a free\n%!"
    Par.kind workers rounds done_ (Atomic.get built) (Atomic.get failed_builds) churned after

(* The disk's calls racing its free, tiered lookups included. *)
let test_disk () =
  let dir = Filename.concat (Filename.get_temp_dir_name ()) (Printf.sprintf "kcache-stress-%d" (Unix.getpid ())) in
  let d = Kcache.Disk.create ~dir ~relaxed_durability:true ~ignore_env:true () in
  let c = Kcache.create () in
  let key i = Kcache.Key.make ~backend:"stress" ~source:(string_of_int (i mod 16)) () in
  let call w i =
    match i mod 3 with
    | 0 -> Kcache.Disk.put d (key (i + w)) "payload"
    | 1 -> ignore (Kcache.Disk.get d (key (i + w)))
    | _ ->
        Kcache.with_lease_tiered c ~disk:d
          (string_of_int ((i + w) mod 16))
          ~disk_key:(key (i + w)) ~build:(fun _ -> "built") ~load:Fun.id ~serialize:Fun.id ignore
  in
  let calls = free_racing call (fun () -> Kcache.Disk.free d) in
  check "calls on the freed disk raise Invalid_argument"
    (match Kcache.Disk.get d (key 0) with _ -> false | exception Invalid_argument _ -> true);
  check "the workers called the disk before it was freed" (calls >= 2000);
  Kcache.free c;
  ignore (Sys.command (Printf.sprintf "rm -rf %s" (Filename.quote dir)));
  Printf.printf "%s: %d disk calls racing its free\n%!" Par.kind calls

let () =
  test_cache ();
  test_disk ();
  finish "OCaml stress tests"
