//! What the directory and the shared stores behind it have in common: the interface of a
//! store (`store`) and the circuit breaker every store uses (`breaker`).

#[cfg_attr(
    not(any(feature = "remote", feature = "object-store")),
    allow(dead_code, reason = "only the stores use it")
)]
pub(crate) mod breaker;
// Until the chain calls the stores through it, only the object-store tier and its tests do.
#[allow(
    dead_code,
    reason = "the chain calls the stores through it once it is wired"
)]
pub(crate) mod store;

pub use store::StoreKind;
