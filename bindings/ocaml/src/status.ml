(* Kcache.Status, without an interface of its own: the signature would only repeat the type. *)

(** kcache's failure codes ([kc_status] without [KC_OK]); [Unknown] for a code this
    binding does not know. In the order of [kc_status] from [KC_ERR_INVALID_ARGUMENT]: the
    stubs pass the index. *)
type t =
  | Invalid_argument
  | Build_failed
  | Device_destroyed
  | Cache_cleared
  | Destroy_failed
  | Reentrant
  | Not_found
  | Panic
  | Unavailable
  | Io
  | Integrity
  | Untrusted
  | Backend
  | Buffer_too_small
  | Unknown

(** The C name, e.g. ["KC_ERR_DEVICE_DESTROYED"]. *)
let to_string = function
  | Invalid_argument -> "KC_ERR_INVALID_ARGUMENT"
  | Build_failed -> "KC_ERR_BUILD_FAILED"
  | Device_destroyed -> "KC_ERR_DEVICE_DESTROYED"
  | Cache_cleared -> "KC_ERR_CACHE_CLEARED"
  | Destroy_failed -> "KC_ERR_DESTROY_FAILED"
  | Reentrant -> "KC_ERR_REENTRANT"
  | Not_found -> "KC_ERR_NOT_FOUND"
  | Panic -> "KC_ERR_PANIC"
  | Unavailable -> "KC_ERR_UNAVAILABLE"
  | Io -> "KC_ERR_IO"
  | Integrity -> "KC_ERR_INTEGRITY"
  | Untrusted -> "KC_ERR_UNTRUSTED"
  | Backend -> "KC_ERR_BACKEND"
  | Buffer_too_small -> "KC_ERR_BUFFER_TOO_SMALL"
  | Unknown -> "KC_UNKNOWN_STATUS"
