//! GPU runtime adapters. Each loads its runtime at run time: no link dependency on any of them.
/// `Debug` for a type holding driver handles or entry points, printing the named fields: with
/// a trailing `..` the output marks the fields left out (`finish_non_exhaustive`).
macro_rules! debug_fields {
    ($ty:ident { $($field:ident),+ }) => {
        $crate::backend::debug_fields!(@impl $ty { $($field),+ } finish);
    };
    ($ty:ident { $($field:ident),+, .. }) => {
        $crate::backend::debug_fields!(@impl $ty { $($field),+ } finish_non_exhaustive);
    };
    (@impl $ty:ident { $($field:ident),+ } $finish:ident) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &self.$field))+
                    .$finish()
            }
        }
    };
}
pub(crate) use debug_fields;

/// `hits / (hits + misses)` for a backend: hits are lookups that compiled nothing (memory hits
/// and values loaded from disk, `loads`), over the memory tier's lookups (`hits + misses`:
/// every load is a memory miss). `None` before the first lookup.
pub(crate) fn hit_rate(memory: &crate::memory::Stats, loads: u64) -> Option<f64> {
    crate::stats::hit_rate(
        memory.hits.saturating_add(loads),
        memory.misses.saturating_sub(loads),
    )
}

pub mod cuda;
pub mod handle_cache;
pub mod library;
pub mod opencl;
pub(crate) mod registry;
pub mod vulkan;
