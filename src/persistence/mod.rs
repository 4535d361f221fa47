//! What the directory and the shared stores behind it have in common: the interface of a
//! store (`store`) and the circuit breaker every store uses (`breaker`).

pub(crate) mod breaker;
pub(crate) mod store;

pub use store::StoreKind;
