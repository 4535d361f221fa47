(* Tests of the OCaml binding: one build per key across threads, a build's exception in the
   builder and every waiter, values surviving Gc.compact under leases, destroys exactly once,
   device eviction, and a scaled-down version of the C stress test. *)

open Check

(* A counter shared by threads. *)
let counter () = (ref 0, Mutex.create ())

let bump (r, m) =
  Mutex.lock m;
  incr r;
  Mutex.unlock m

let count (r, _) = !r

(* Waits, letting other threads run, until [cond] holds; fails the test instead of hanging. *)
let await name cond =
  let rec go n =
    if cond () then ()
    else if n = 0 then failwith ("never happened: " ^ name)
    else begin
      Thread.yield ();
      go (n - 1)
    end
  in
  go 10_000_000

let raises_status status f =
  match f () with
  | _ -> false
  | exception Kcache.Error (s, _) -> s = status

let test_basic () =
  let built = counter () in
  Kcache.with_cache (fun c ->
      let build k =
        bump built;
        "value of " ^ k
      in
      check "first lookup builds" (Kcache.find_or_build c "a" ~build = "value of a");
      check "second lookup hits" (Kcache.find_or_build c "a" ~build = "value of a");
      check "a key is bytes" (Kcache.find_or_build c "a\000b" ~build = "value of a\000b");
      let long = String.make 1000 'x' in
      check "a long key" (Kcache.find_or_build c long ~build = "value of " ^ long);
      check "the empty key" (Kcache.find_or_build c "" ~build = "value of ");
      check_int "builds" 4 (count built);
      let s = Kcache.stats c in
      check_int "stats hits" 1 s.hits;
      check_int "stats misses" 4 s.misses;
      check_int "stats builds" 4 s.builds;
      check_int "stats leases" 0 s.leases;
      check_int "length" 4 (Kcache.length c);
      check "hit rate" (Kcache.hit_rate s = Some 0.2);
      check "remove present" (Kcache.remove c "a");
      check "remove absent" (not (Kcache.remove c "a"));
      Kcache.reset_stats c;
      let s = Kcache.stats c in
      check_int "reset hits" 0 s.hits;
      check_int "reset keeps entries" 3 s.entries;
      check "no lookup, no rate" (Kcache.hit_rate s = None));
  check "version" (String.length (Kcache.version ()) >= 5)

(* Every thread asks for one key; the build holds until all the others are waiting for it. *)
let test_single_flight () =
  let n = 8 in
  let built = counter () in
  Kcache.with_cache (fun c ->
      let build k =
        bump built;
        await "all threads waiting" (fun () -> (Kcache.stats c).waits = n - 1);
        ref k
      in
      let results = Array.make n None in
      let threads =
        List.init n (fun i ->
            Thread.create (fun () -> results.(i) <- Some (Kcache.find_or_build c "key" ~build)) ())
      in
      List.iter Thread.join threads;
      check_int "one build for all threads" 1 (count built);
      let first = Option.get results.(0) in
      Array.iter (fun r -> check "every thread got the same value" (Option.get r == first)) results;
      let s = Kcache.stats c in
      check_int "stats builds" 1 s.builds;
      check_int "stats waits" (n - 1) s.waits;
      check_int "stats misses" 1 s.misses)

exception Boom of int

let test_build_raises () =
  let n = 6 in
  Kcache.with_cache (fun c ->
      (match Kcache.find_or_build c "bad" ~build:(fun _ -> raise (Boom 1)) with
      | _ -> check "the builder sees the exception" false
      | exception Boom 1 -> ());
      check_int "a failure is not cached" 0 (Kcache.length c);
      let built = counter () in
      let build _ =
        bump built;
        await "all threads waiting" (fun () -> (Kcache.stats c).waits = n - 1);
        raise (Boom 42)
      in
      let got = Array.make n 0 in
      let threads =
        List.init n (fun i ->
            Thread.create
              (fun () ->
                match Kcache.find_or_build c "shared" ~build with
                | _ -> ()
                | exception Boom code -> got.(i) <- code)
              ())
      in
      List.iter Thread.join threads;
      check_int "one build" 1 (count built);
      Array.iter (check_int "the builder and every waiter get the exception" 42) got;
      let s = Kcache.stats c in
      check_int "stats build_failures" 2 s.build_failures;
      check_int "stats builds" 0 s.builds;
      (* A raising weight function fails the build the same way. *)
      Kcache.with_cache ~weight:(fun _ -> raise (Boom 7)) (fun c2 ->
          match Kcache.find_or_build c2 "k" ~build:(fun k -> k) with
          | _ -> check "weight raising" false
          | exception Boom 7 -> ()))

let test_gc_compact_under_leases () =
  let destroyed = counter () in
  Kcache.with_cache ~destroy:(fun _ -> bump destroyed) (fun c ->
      let build k = (String.concat "" [ "built:"; k ], Array.init 100 (fun i -> i)) in
      Kcache.with_lease c "one" ~build (fun (s1, a1) ->
          Kcache.with_lease c "two" ~build (fun (s2, _) ->
              (* Garbage around the values so that compaction moves them. *)
              for i = 0 to 10_000 do
                ignore (Sys.opaque_identity (String.make (i mod 64) 'g'))
              done;
              Kcache.clear c;
              Gc.compact ();
              Gc.full_major ();
              check "value one intact" (s1 = "built:one" && a1.(99) = 99);
              check "value two intact" (s2 = "built:two");
              check_int "cleared but leased: not destroyed" 0 (count destroyed);
              check_int "stats leases" 2 (Kcache.stats c).leases);
          check_int "one lease ended: one destroy" 1 (count destroyed));
      check_int "both leases ended: two destroys" 2 (count destroyed);
      (* Values read back after a compaction are the cached ones. *)
      let v = Kcache.find_or_build c "three" ~build in
      Gc.compact ();
      check "the same value after compaction" (Kcache.find_or_build c "three" ~build == v))

(* Runs [action] while a build of [key] is in flight on another thread; the status that build's
   lookup failed with, if it failed. *)
let during_build c ?device key action =
  let started = ref false and go = ref false in
  let result = ref None in
  let t =
    Thread.create
      (fun () ->
        match
          Kcache.find_or_build c ?device key ~build:(fun k ->
              started := true;
              await "the action" (fun () -> !go);
              k ^ k)
        with
        | _ -> ()
        | exception Kcache.Error (status, _) -> result := Some status)
      ()
  in
  await "build started" (fun () -> !started);
  action ();
  go := true;
  Thread.join t;
  !result

let test_destroy_and_eviction () =
  let destroyed = counter () in
  let c = Kcache.create ~max_entries:2 ~weight:String.length ~destroy:(fun _ -> bump destroyed) () in
  let build k = k ^ k in
  ignore (Kcache.find_or_build c ~device:1 "a" ~build);
  ignore (Kcache.find_or_build c ~device:1 "b" ~build);
  ignore (Kcache.find_or_build c ~device:2 "c" ~build);
  check_int "over capacity: one destroyed" 1 (count destroyed);
  check_int "capacity evictions" 1 (Kcache.stats c).capacity_evictions;
  Kcache.with_lease_weight c "c" ~build (fun v w ->
      check "value" (v = "cc");
      check_int "weight" 2 w);
  Kcache.evict_device c 2;
  check_int "device 2 evicted" 2 (count destroyed);
  check_int "one entry left" 1 (Kcache.length c);
  (* A build in flight when its device is evicted fails, and its value is destroyed. *)
  let result = during_build c ~device:3 "d" (fun () -> Kcache.evict_device c 3) in
  check "in-flight build fails with Device_destroyed" (result = Some Kcache.Status.Device_destroyed);
  check_int "its value destroyed" 3 (count destroyed);
  (* A value leased across free is destroyed when its lease ends. *)
  Kcache.with_lease c "e" ~build (fun v ->
      Kcache.free c;
      check "leased value readable after free" (v = "ee");
      check_int "only the unleased entry destroyed" 4 (count destroyed));
  check_int "every built value destroyed once" 5 (count destroyed);
  Kcache.free c;
  check "a call after free" (match Kcache.length c with _ -> false | exception Invalid_argument _ -> true)

(* A lease's release runs the destroy on the releasing thread; that destroy may call kcache,
   whose own destroys then run as from any other call. *)
let test_destroy_calls_kcache () =
  let inner_destroyed = counter () in
  Kcache.with_cache ~destroy:(fun _ -> bump inner_destroyed) (fun inner ->
      Kcache.with_cache ~destroy:(fun _ -> Kcache.clear inner) (fun outer ->
          ignore (Kcache.find_or_build inner "x" ~build:Fun.id);
          Kcache.with_lease outer "o" ~build:Fun.id (fun _ -> Kcache.clear outer);
          check_int "the destroy run by the release cleared the other cache" 1
            (count inner_destroyed);
          check_int "that cache is empty" 0 (Kcache.length inner)))

let test_invalidated_by_clear () =
  let destroyed = counter () in
  Kcache.with_cache ~invalidated_by_clear:true ~destroy:(fun _ -> bump destroyed) (fun c ->
      check "a build in flight across a clear fails with Cache_cleared"
        (during_build c "k" (fun () -> Kcache.clear c) = Some Kcache.Status.Cache_cleared);
      check_int "its value destroyed" 1 (count destroyed);
      check_int "stats discarded" 1 (Kcache.stats c).discarded);
  Kcache.with_cache (fun c ->
      check "without invalidated_by_clear it is installed"
        (during_build c "k" (fun () -> Kcache.clear c) = None);
      check_int "one entry" 1 (Kcache.length c))

let test_reentrant () =
  Kcache.with_cache (fun c ->
      let rec build k = "x" ^ Kcache.find_or_build c k ~build in
      check "asking for the key being built"
        (raises_status Kcache.Status.Reentrant (fun () -> Kcache.find_or_build c "r" ~build));
      (* Another key from inside a build is fine. *)
      let outer _ = "outer+" ^ Kcache.find_or_build c "inner" ~build:(fun _ -> "inner") in
      check "nested build" (Kcache.find_or_build c "o" ~build:outer = "outer+inner"))

(* Threads of lookups, held leases, removals, evictions and clears; then exact accounting:
   no value seen after its destroy, every built value destroyed exactly once. *)
type item = { key : string; mutable alive : bool }

let test_stress () =
  let threads = 4 and ops = 3000 and keys = 16 in
  let built = counter () and destroyed = counter () in
  let c =
    Kcache.create ~max_entries:12
      ~destroy:(fun v ->
        v.alive <- false;
        bump destroyed)
      ()
  in
  let build k =
    bump built;
    { key = k; alive = true }
  in
  let bad = counter () in
  let worker seed () =
    let rng = Random.State.make [| seed |] in
    for _ = 1 to ops do
      let i = Random.State.int rng keys in
      let key = "k" ^ string_of_int i in
      match Random.State.int rng 100 with
      | r when r < 80 -> (
          try
            Kcache.with_lease c ~device:(i mod 3) key ~build (fun v ->
                Thread.yield ();
                if (not v.alive) || v.key <> key then bump bad)
          with Kcache.Error ((Device_destroyed | Cache_cleared), _) -> ())
      | r when r < 88 -> ignore (Kcache.remove c key)
      | r when r < 92 -> Kcache.clear c
      | r when r < 96 -> Kcache.evict_device c (i mod 3)
      | _ -> Gc.minor ()
    done
  in
  List.iter Thread.join (List.init threads (fun i -> Thread.create (worker i) ()));
  check_int "no destroyed or wrong value under a lease" 0 (count bad);
  let s = Kcache.stats c in
  check_int "stats builds = builds run" (count built) s.builds;
  check_int "no lease left" 0 s.leases;
  check_int "destroyed = built - entries" (count built - s.entries) (count destroyed);
  Kcache.free c;
  check_int "after free, every built value destroyed once" (count built) (count destroyed)

let () =
  test_basic ();
  test_single_flight ();
  test_build_raises ();
  test_gc_compact_under_leases ();
  test_destroy_and_eviction ();
  test_destroy_calls_kcache ();
  test_invalidated_by_clear ();
  test_reentrant ();
  test_stress ();
  finish "OCaml binding tests"
