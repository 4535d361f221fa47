(* Kcache.Framework_cache: a framework's disk cache of kernels, its entries in kcache's disk
   tier. What is left here is the interface: string keys, a process-wide set of counters, the
   directory rule and its trust checks (which the tier makes again when it opens). *)

(* Read once, when the module is initialised. *)
let debug_enabled =
  match Sys.getenv_opt "KCACHE_LOG" with
  | Some level -> String.lowercase_ascii level = "debug"
  | None -> false

(* Messages as kcache's own: one line on standard error, with its prefix. *)
let debugf fmt =
  if debug_enabled then Printf.eprintf ("kcache: debug: " ^^ fmt ^^ "\n%!")
  else Printf.ifprintf stderr fmt

let warnf fmt = Printf.eprintf ("kcache: " ^^ fmt ^^ "\n%!")

type stats = { mutable hits : int; mutable misses : int; mutable puts : int; mutable errors : int }

let stats = { hits = 0; misses = 0; puts = 0; errors = 0 }
let lock = Mutex.create ()

let locked f =
  Mutex.lock lock;
  Fun.protect ~finally:(fun () -> Mutex.unlock lock) f

let count field = locked (fun () -> field stats)
let get_stats () = locked (fun () -> { stats with hits = stats.hits })

let reset_stats () =
  locked (fun () ->
      stats.hits <- 0;
      stats.misses <- 0;
      stats.puts <- 0;
      stats.errors <- 0)

let hit_rate () =
  let s = get_stats () in
  if s.hits + s.misses = 0 then 0.0 else float_of_int s.hits /. float_of_int (s.hits + s.misses)

let print_stats () =
  let s = get_stats () in
  Printf.printf "kcache disk cache: %d hits, %d misses, %d puts, %d errors, hit rate %.1f%%\n%!"
    s.hits s.misses s.puts s.errors (100.0 *. hit_rate ())

let cache_dir_name = "kcache"

let enabled () =
  Sys.getenv_opt "SAREK_DISK_CACHE" <> Some "0" && Sys.getenv_opt "KCACHE_DISABLE" <> Some "1"

(* An absolute path, as the XDG rule takes them: an empty or relative value is unset. *)
let absolute name =
  match Sys.getenv_opt name with
  | Some p when p <> "" && not (Filename.is_relative p) -> Some p
  | _ -> None

(* The tier's own rule (KCACHE_DIR, then XDG_CACHE_HOME, then HOME), so that this module and
   every other kcache user of the process find one directory. *)
let dir_name () =
  match absolute "KCACHE_DIR" with
  | Some d -> Some d
  | None -> (
      match absolute "XDG_CACHE_HOME" with
      | Some x -> Some (Filename.concat x cache_dir_name)
      | None ->
          Option.map
            (fun h -> Filename.concat (Filename.concat h ".cache") cache_dir_name)
            (absolute "HOME"))

(* The seed's last resort, which [trusted_dir] never accepts: another user can make it first. *)
let shared_temp_dir () = Filename.concat (Filename.get_temp_dir_name ()) cache_dir_name

let rec make_dir dir =
  if not (Sys.file_exists dir) then begin
    let parent = Filename.dirname dir in
    if parent <> dir then make_dir parent;
    try Unix.mkdir dir 0o700 with Unix.Unix_error (Unix.EEXIST, _, _) -> ()
  end

let get_cache_dir () =
  let dir = Option.value (dir_name ()) ~default:(shared_temp_dir ()) in
  make_dir dir;
  dir

let untrusted_warned = Atomic.make false

let warn_untrusted fmt =
  if Atomic.exchange untrusted_warned true then Printf.ifprintf stderr fmt else warnf fmt

let refuse why =
  warn_untrusted "the disk cache is off: %s" why;
  None

(* The directory [dir], made if missing, when this user alone may write to it. *)
let owned_dir dir =
  match make_dir dir with
  | exception Unix.Unix_error (e, _, path) ->
      refuse (Printf.sprintf "cannot create %s: %s" path (Unix.error_message e))
  | () -> (
      match Unix.stat dir with
      | exception Unix.Unix_error (e, _, _) ->
          refuse (Printf.sprintf "%s: %s" dir (Unix.error_message e))
      | st when st.st_kind <> Unix.S_DIR -> refuse (dir ^ " is not a directory")
      | st when st.st_uid <> Unix.geteuid () ->
          refuse (Printf.sprintf "%s is owned by another user (uid %d)" dir st.st_uid)
      | st when st.st_perm land 0o022 <> 0 ->
          refuse (Printf.sprintf "%s is writable by group or others (mode %o)" dir st.st_perm)
      | _ -> Some dir)

(* [get_cache_dir]'s directory, but never its fallback: refused before it is made. *)
let trusted_dir () =
  match dir_name () with
  | Some dir -> owned_dir dir
  | None ->
      refuse
        "KCACHE_DIR, XDG_CACHE_HOME and HOME are unset, and the shared temporary directory \
         is not trusted"

let key_schema_version = "kcache-fc1"

let compute_key_with_options ~options ~dev_name ~driver_version ~name ~source =
  (* In their order, each name and value an input of its own: an option given twice, or two
     that interact by position (-DX then -UX), are keyed as given. *)
  let ordered_options = List.concat_map (fun (n, v) -> [ n; v ]) options in
  key_schema_version ^ "-"
  ^ Key.to_hex
      (Key.make ~backend:"framework_cache" ~device_name:dev_name ~driver_version ~entry:name
         ~source ~ordered_options ())

let compute_key ~dev_name ~driver_version ~name ~source =
  compute_key_with_options ~options:[] ~dev_name ~driver_version ~name ~source

(* One tier per directory for the process, opened on first use and kept: the directory can
   change between calls (its variables are read on every call), a tier cannot. *)
let tiers : (string, Disk.t) Hashtbl.t = Hashtbl.create 1

let tier () =
  match trusted_dir () with
  | None -> None
  | Some dir -> (
      match locked (fun () -> Hashtbl.find_opt tiers dir) with
      | Some d -> Some d
      | None -> (
          match Disk.create ~dir () with
          | exception Cache.Error (_, why) -> refuse why
          | d ->
              locked (fun () ->
                  match Hashtbl.find_opt tiers dir with
                  | Some other ->
                      Disk.free d;
                      Some other
                  | None ->
                      Hashtbl.replace tiers dir d;
                      Some d)))

(* The tier's key of a string key: 32 bytes, whatever the string. *)
let disk_key key = Key.make ~backend:"framework_cache" ~source:key ()

let get ~key =
  if not (enabled ()) then None
  else
    match tier () with
    | None -> None
    | Some d -> (
        match Disk.get d (disk_key key) with
        | Some data ->
            count (fun s -> s.hits <- s.hits + 1);
            Some data
        | None ->
            count (fun s -> s.misses <- s.misses + 1);
            None
        | exception Cache.Error (_, why) ->
            debugf "reading the entry for %s failed: %s" key why;
            count (fun s -> s.errors <- s.errors + 1);
            None)

let put ~key ~data =
  if enabled () then
    match tier () with
    | None -> ()
    | Some d -> (
        match Disk.put d (disk_key key) data with
        | () -> count (fun s -> s.puts <- s.puts + 1)
        | exception Cache.Error (_, why) ->
            debugf "writing the entry for %s failed: %s" key why;
            count (fun s -> s.errors <- s.errors + 1))

let write_atomically ~dir ~filename data =
  let temp = Filename.temp_file ~temp_dir:dir ("." ^ filename ^ ".") ".tmp" in
  match
    let fd = Unix.openfile temp [ Unix.O_WRONLY; Unix.O_CLOEXEC ] 0o600 in
    Fun.protect
      ~finally:(fun () -> Unix.close fd)
      (fun () ->
        let n = String.length data in
        let rec write off = if off < n then write (off + Unix.write_substring fd data off (n - off)) in
        write 0;
        Unix.fsync fd);
    Unix.rename temp (Filename.concat dir filename)
  with
  | () -> ()
  | exception e ->
      let backtrace = Printexc.get_raw_backtrace () in
      (try Sys.remove temp with Sys_error _ -> ());
      Printexc.raise_with_backtrace e backtrace
