(* Keys for the disk tier, from kcache's key builder (the kc_key_builder functions). *)

type builder

external builder_new : unit -> builder = "ml_kc_key_builder_new"
external builder_free : builder -> unit = "ml_kc_key_builder_free"
external builder_set : builder -> int -> string -> unit = "ml_kc_key_builder_set"
external builder_add : builder -> int -> string -> string -> unit = "ml_kc_key_builder_add"
external builder_ordered_option : builder -> string -> unit = "ml_kc_key_builder_ordered_option"
external builder_finish : builder -> string = "ml_kc_key_builder_finish"

let length = 32

(* The field indexes are the KC_KEY_* constants; the kinds are what ml_kc_key_builder_add
   takes. *)
let make ?backend ?device_name ?device_vendor ?driver_version ?compiler_version ?entry ?source
    ?(options = []) ?(ordered_options = []) ?(extras = []) ?(dependencies = []) () =
  let b = builder_new () in
  Fun.protect
    ~finally:(fun () -> builder_free b)
    (fun () ->
      List.iteri
        (fun field v -> Option.iter (builder_set b field) v)
        [ backend; device_name; device_vendor; driver_version; compiler_version; entry; source ];
      List.iter
        (fun (kind, pairs) -> List.iter (fun (name, v) -> builder_add b kind name v) pairs)
        [ (0, options); (1, extras); (2, dependencies) ];
      List.iter (builder_ordered_option b) ordered_options;
      builder_finish b)

let to_hex key = String.concat "" (List.map (fun c -> Printf.sprintf "%02x" (Char.code c)) (List.of_seq (String.to_seq key)))
