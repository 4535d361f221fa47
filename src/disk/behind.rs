//! What the disk tier knows of whatever sits behind it (the chain of shared stores,
//! `crate::persistence`): something to tell of each entry published here for a value this
//! process built, and something that adds its counters to the directory's.

use std::time::Duration;

use super::Descriptor;
use crate::directory_counters::DirectoryCounters;
use crate::key::Key;

pub(crate) trait Behind: Send + Sync {
    /// The entry for `key` was just published here, from a value built in this process (on
    /// the background writer, after the entry's lock was released).
    fn published(&self, key: &Key, payload: &[u8], build_time: Duration, descriptor: &Descriptor);

    /// This process's counters of what sits behind, since it was opened (never reset), in
    /// their fields of the directory's record; the disk tier's own fields are left zero.
    fn counters(&self) -> DirectoryCounters;
}
