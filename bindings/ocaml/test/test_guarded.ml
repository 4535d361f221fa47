(* Kcache.Guarded_cache against the behaviours of the mutex-guarded table it replaces, one test
   each, with builds in flight on other workers (Par: domains on OCaml 5, systhreads on 4). *)

open Check
module G = Kcache.Guarded_cache

(* Waits until [cond] holds, letting other workers run; fails instead of hanging. *)
let await name cond =
  let deadline = Unix.gettimeofday () +. 60.0 in
  while not (cond ()) do
    if Unix.gettimeofday () > deadline then failwith ("never happened: " ^ name);
    Thread.yield ();
    Unix.sleepf 0.0005
  done

(* A gate a build waits at until the test opens it. *)
let gate () = Atomic.make false
let open_gate g = Atomic.set g true
let pass g = await "the gate opened" (fun () -> Atomic.get g)

type v = { id : int; alive : bool Atomic.t }

(* A cache counting its builds and destroys; [fail v] makes a destroy raise. *)
let counted ?(invalidated_by_clear = false) ?(fail = fun _ -> false) () =
  let built = Atomic.make 0 and destroyed = Atomic.make 0 in
  let destroy v =
    Atomic.incr destroyed;
    Atomic.set v.alive false;
    if fail v then raise (Failure (Printf.sprintf "destroy %d" v.id))
  in
  let c = G.create ~invalidated_by_clear ~destroy () in
  let build () = { id = Atomic.fetch_and_add built 1; alive = Atomic.make true } in
  (c, build, built, destroyed)

(* Runs [meanwhile] while another worker's build for the key "k" is held, then lets the build
   finish: how that lookup ended. *)
let while_building c ?device_id build meanwhile =
  let g = gate () and started = Atomic.make false in
  let w =
    Par.spawn (fun () ->
        match
          G.find_or_build c ~key:"k" ?device_id (fun () ->
              Atomic.set started true;
              pass g;
              build ())
        with
        | _ -> "installed"
        | exception G.Device_destroyed_during_build -> "device destroyed"
        | exception G.Cache_cleared_during_build -> "cleared"
        | exception Failure _ -> "the destroy's failure")
  in
  await "the build started" (fun () -> Atomic.get started);
  meanwhile ();
  open_gate g;
  Par.join w

(* The compile runs with no lock held: while one worker's build is held at a gate, other
   lookups hit, build other keys and count entries; a build may itself use the cache. *)
let test_lock_discipline () =
  let c, build, built, _ = counted () in
  ignore (G.find_or_build c ~key:"ready" build);
  let g = gate () and started = Atomic.make false in
  let w =
    Par.spawn (fun () ->
        G.find_or_build c ~key:"slow" (fun () ->
            Atomic.set started true;
            pass g;
            build ()))
  in
  await "the slow build started" (fun () -> Atomic.get started);
  check "a hit while another key builds" ((G.find_or_build c ~key:"ready" build).id = 0);
  check "a miss builds while another key builds" ((G.find_or_build c ~key:"other" build).id = 1);
  check_int "length while a build runs" 2 (G.length c);
  let nested =
    G.find_or_build c ~key:"outer" (fun () ->
        let inner = G.find_or_build c ~key:"inner" build in
        { (build ()) with id = 100 + inner.id })
  in
  check "a build that uses the cache" (nested.id = 102);
  open_gate g;
  check "the slow build installed" ((Par.join w).id = 4);
  check_int "builds" 5 (Atomic.get built);
  check_int "entries" 5 (G.length c)

(* The table's double-check let two workers compile one key and destroyed the loser; here
   they share one build: one compile, no loser, no destroy, one value everywhere. *)
let test_one_build_no_loser () =
  let c, build, built, destroyed = counted () in
  let n = 6 in
  let build () =
    await "every other worker waiting" (fun () -> (G.stats c).waits = n - 1);
    build ()
  in
  let ws = List.init n (fun _ -> Par.spawn (fun () -> G.find_or_build c ~key:"k" build)) in
  let values = List.map Par.join ws in
  check_int "one compile for all workers" 1 (Atomic.get built);
  check_int "no losing value destroyed" 0 (Atomic.get destroyed);
  check "every worker got the one value" (List.for_all (fun v -> v == List.hd values) values)

(* A build for a device that is evicted meanwhile, though it has no entries: its value is
   destroyed, the caller gets Device_destroyed_during_build; a later build for the device is
   installed. *)
let test_device_destroyed () =
  let c, build, _, destroyed = counted () in
  ignore (G.find_or_build c ~key:"other device" ~device_id:2 build);
  let got = while_building c ~device_id:1 build (fun () -> G.evict_device c 1) in
  check "Device_destroyed_during_build" (got = "device destroyed");
  check_int "the value built was destroyed" 1 (Atomic.get destroyed);
  check_int "the other device's entry stays" 1 (G.length c);
  ignore (G.find_or_build c ~key:"k" ~device_id:1 build);
  check_int "a later build for the device installed" 2 (G.length c);
  G.evict_device c 7;
  check_int "evicting a device with no entries removes nothing" 2 (G.length c);
  G.evict_device c 1;
  check_int "evicting the device's entry" 1 (G.length c);
  check_int "its value destroyed" 2 (Atomic.get destroyed)

(* How a lookup of "k" ended, run on another worker. *)
let spawn_lookup c ?device_id build =
  Par.spawn (fun () ->
      match G.find_or_build c ~key:"k" ?device_id build with
      | v -> Printf.sprintf "value %d" v.id
      | exception G.Device_destroyed_during_build -> "device destroyed")

(* Each call is judged against its own window, as when every caller built for itself: sharing
   a build never hands a caller another caller's eviction, nor a value built across its own. *)
let test_own_window () =
  (* A lookup with no device waits for a build for device 1, which is evicted: it builds again. *)
  let c, build, _, destroyed = counted () in
  let waiter = ref None in
  let got =
    while_building c ~device_id:1 build (fun () ->
        waiter := Some (spawn_lookup c build);
        await "the lookup waiting" (fun () -> (G.stats c).waits = 1);
        G.evict_device c 1)
  in
  check "the builder's device destroyed" (got = "device destroyed");
  check "the lookup without a device got its own build"
    (Par.join (Option.get !waiter) = "value 1");
  check_int "the builder's value destroyed" 1 (Atomic.get destroyed);
  (* A lookup for device 3 waits for a build with no device; 3 is evicted meanwhile. *)
  let c, build, _, destroyed = counted () in
  let waiter = ref None in
  let got =
    while_building c build (fun () ->
        waiter := Some (spawn_lookup c ~device_id:3 build);
        await "the lookup waiting" (fun () -> (G.stats c).waits = 1);
        G.evict_device c 3)
  in
  check "the builder installed" (got = "installed");
  check "the lookup for the evicted device got no value"
    (Par.join (Option.get !waiter) = "device destroyed");
  G.evict_device c 3;
  check_int "the value is not recorded against device 3" 1 (G.length c);
  check_int "nothing destroyed" 0 (Atomic.get destroyed);
  (* A lookup that starts after evict_device returned never joins the build it doomed. *)
  let c, build, _, destroyed = counted () in
  let later = ref None in
  let got =
    while_building c ~device_id:1 build (fun () ->
        G.evict_device c 1;
        later := Some (spawn_lookup c ~device_id:1 build);
        (* It either builds (a second miss) or joins the held build (a wait). *)
        await "the later lookup under way" (fun () ->
            let s = G.stats c in
            s.misses = 2 || s.waits = 1))
  in
  check "the doomed build" (got = "device destroyed");
  check "the later lookup built with live handles" (Par.join (Option.get !later) = "value 0");
  check_int "the doomed value destroyed once" 1 (Atomic.get destroyed);
  check_int "the later value installed" 1 (G.length c)

(* A build in flight across a clear: destroyed with Cache_cleared_during_build on a cache whose
   values borrow (invalidated_by_clear), installed on one whose values own their handles. *)
let test_clear_during_build invalidated_by_clear =
  let c, build, _, destroyed = counted ~invalidated_by_clear () in
  ignore (G.find_or_build c ~key:"before" build);
  let got =
    while_building c build (fun () ->
        G.clear c;
        check_int "the clear destroyed the entry before it" 1 (Atomic.get destroyed))
  in
  if invalidated_by_clear then begin
    check "Cache_cleared_during_build" (got = "cleared");
    check_int "the borrowed value destroyed" 2 (Atomic.get destroyed);
    check_int "nothing installed" 0 (G.length c)
  end
  else begin
    check "an owning cache installs the build" (got = "installed");
    check_int "the owned value kept" 1 (Atomic.get destroyed);
    check_int "installed" 1 (G.length c)
  end

(* Failing destroys: every value is attempted, the first exception is raised afterwards, by
   clear and by evict_device alike. *)
let test_failing_destroys () =
  let c, build, _, destroyed = counted ~fail:(fun v -> v.id mod 2 = 1) () in
  for i = 0 to 3 do
    ignore (G.find_or_build c ~key:i ~device_id:(i / 2) build)
  done;
  (match G.evict_device c 0 with
  | () -> check "evict_device raises the failing destroy" false
  | exception Failure m -> check "evict_device raises destroy 1's exception" (m = "destroy 1"));
  check_int "both of device 0's values attempted" 2 (Atomic.get destroyed);
  ignore (G.find_or_build c ~key:99 build);
  (match G.clear c with
  | () -> check "clear raises the failing destroy" false
  | exception Failure m -> check "clear raises destroy 3's exception" (m = "destroy 3"));
  check_int "every value attempted" 5 (Atomic.get destroyed);
  check_int "the cache is empty" 0 (G.length c);
  check_int "kcache counted the failures" 2 (G.stats c).destroy_errors;
  G.clear c

(* On the paths that discard a value just built, a failing destroy is dropped: the caller
   sees why no value came back. *)
let test_discard_drops_destroy_failure () =
  let c, build, _, destroyed = counted ~invalidated_by_clear:true ~fail:(fun _ -> true) () in
  let discarded evict expected =
    check ("the caller sees " ^ expected) (while_building c ~device_id:3 build evict = expected)
  in
  discarded (fun () -> G.evict_device c 3) "device destroyed";
  discarded (fun () -> G.clear c) "cleared";
  check_int "both discarded values destroyed" 2 (Atomic.get destroyed)

(* A destroy runs outside every lock: it may call into the cache it is destroying from. *)
let test_reentrant_destroy () =
  let seen = Atomic.make (-1) in
  let rec c =
    lazy
      (G.create
         ~destroy:(fun v ->
           let c = Lazy.force c in
           Atomic.set seen (G.length c);
           if v = "a" then ignore (G.find_or_build c ~key:"made by a destroy" (fun () -> "x")))
         ())
  in
  let c = Lazy.force c in
  ignore (G.find_or_build c ~key:"a" (fun () -> "a"));
  G.clear c;
  check_int "the destroy read the cache" 0 (Atomic.get seen);
  check_int "and built in it" 1 (G.length c)

(* Keys of any type, compared by contents as Hashtbl compares them. *)
type k = { dev : string; n : int; opts : string list }

let test_keys_of_any_type () =
  let c, build, built, _ = counted () in
  let key () = { dev = "gpu" ^ string_of_int 0; n = 3; opts = [ "-O2"; String.make 1 'x' ] } in
  let a = G.find_or_build c ~key:(key ()) build in
  check "an equal record built apart hits" (G.find_or_build c ~key:(key ()) build == a);
  check "another record misses" (G.find_or_build c ~key:{ (key ()) with n = 4 } build != a);
  let t = G.create ~destroy:ignore () in
  ignore (G.find_or_build t ~key:(1, "s") (fun () -> 1));
  check "a tuple key hits" (G.find_or_build t ~key:(1, "s" ^ "") (fun () -> 2) = 1);
  check_int "records built" 2 (Atomic.get built)

(* A value used inside with_value is not destroyed while it is used, whatever another worker
   clears: the table's quiescence obligation is gone. *)
let test_no_destroy_while_used () =
  let c, build, _, destroyed = counted () in
  let alive_inside =
    G.with_value c ~key:"k" build (fun v ->
        Par.join (Par.spawn (fun () -> G.clear c));
        let alive = Atomic.get v.alive in
        check_int "cleared: no entry" 0 (G.length c);
        check_int "not destroyed while used" 0 (Atomic.get destroyed);
        alive)
  in
  check "alive while used" alive_inside;
  check_int "destroyed when its use ended" 1 (Atomic.get destroyed)

(* A build's exception reaches its caller. *)
let test_build_exceptions () =
  let c = G.create ~destroy:ignore () in
  (match G.find_or_build c ~key:"bad" (fun () -> failwith "no compiler") with
  | _ -> check "the build's exception" false
  | exception Failure m -> check "the build's own exception" (m = "no compiler"));
  check_int "a failure is not cached" 0 (G.length c);
  check "a negative device_id"
    (match G.find_or_build c ~key:"n" ~device_id:(-1) (fun () -> 0) with
    | _ -> false
    | exception Invalid_argument _ -> true)

(* A build that asks for its own key, as under the seed's lock discipline: the inner lookup is
   a miss whose value is installed; the outer build's value, the loser, goes to destroy and
   the installed one is returned. Nested deeper, the innermost value wins; a second lookup in
   the same build finds the first's value; a build that raises after its nested lookup raises,
   and the nested value stays installed. *)
let test_nested_build () =
  let destroyed = ref [] in
  let c = G.create ~destroy:(fun v -> destroyed := v :: !destroyed) () in
  let inner = ref 0 and again = ref 0 in
  let v =
    G.find_or_build c ~key:"r" (fun () ->
        inner := G.find_or_build c ~key:"r" (fun () -> 2);
        again := G.find_or_build c ~key:"r" (fun () -> 3);
        1)
  in
  check_int "the inner lookup got its own build's value" 2 !inner;
  check_int "a second inner lookup found it" 2 !again;
  check_int "the installed value is returned" 2 v;
  check "the outer build's value went to destroy" (!destroyed = [ 1 ]);
  check_int "one entry" 1 (G.length c);
  check_int "a later lookup hits the installed value" 2 (G.find_or_build c ~key:"r" (fun () -> 4));
  destroyed := [];
  let v =
    G.find_or_build c ~key:"deep" (fun () ->
        ignore
          (G.find_or_build c ~key:"deep" (fun () ->
               ignore (G.find_or_build c ~key:"deep" (fun () -> 30));
               20));
        10)
  in
  check_int "nested twice: the innermost value is installed" 30 v;
  check "the two others went to destroy" (List.sort compare !destroyed = [ 10; 20 ]);
  check_int "another key is a build of its own inside" 5
    (G.find_or_build c ~key:"outer" (fun () -> G.find_or_build c ~key:"other" (fun () -> 5)));
  check "a build raising after its nested lookup raises"
    (match
       G.find_or_build c ~key:"raise" (fun () ->
           ignore (G.find_or_build c ~key:"raise" (fun () -> 7));
           failwith "late")
     with
    | _ -> false
    | exception Failure m -> m = "late");
  check_int "and the nested value stays installed" 7 (G.find_or_build c ~key:"raise" (fun () -> 8));
  check "a nested build's exception reaches the build that asked"
    (G.find_or_build c ~key:"fails" (fun () ->
         match G.find_or_build c ~key:"fails" (fun () -> failwith "inner") with
         | _ -> 0
         | exception Failure _ -> 9)
    = 9);
  let seen = ref 0 in
  check_int "with_value around a nested build: the installed value" 11
    (G.with_value c ~key:"w"
       (fun () ->
         G.with_value c ~key:"w" (fun () -> 11) (fun v ->
             seen := v;
             v + 1))
       Fun.id);
  check_int "the nested with_value ran on its build's value" 11 !seen

let () =
  test_nested_build ();
  test_lock_discipline ();
  test_one_build_no_loser ();
  test_device_destroyed ();
  test_own_window ();
  test_clear_during_build true;
  test_clear_during_build false;
  test_failing_destroys ();
  test_discard_drops_destroy_failure ();
  test_reentrant_destroy ();
  test_keys_of_any_type ();
  test_no_destroy_while_used ();
  test_build_exceptions ();
  finish ("Guarded_cache on " ^ Par.kind)
