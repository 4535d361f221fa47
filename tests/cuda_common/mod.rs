//! Helpers shared by the CUDA integration tests.

#![allow(dead_code)] // Each target uses a different subset.

use std::fmt::Debug;

use kcache::Error;

/// Asserts that `loaded` is `Error::Unavailable` with a message containing `says`.
pub fn assert_unavailable<T: Debug>(loaded: Result<T, Error>, says: &str) {
    match loaded {
        Err(Error::Unavailable(message)) => assert!(message.contains(says), "{message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// What a child run printed after `CHILD `, on the first line that has it.
pub fn child_line(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.split_once("CHILD ").map(|(_, rest)| rest.to_owned()))
        .unwrap_or_else(|| panic!("no CHILD line in: {stdout}"))
}
