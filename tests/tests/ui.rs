//! Compile-time behaviour of `#[idempotent]`: every supported form compiles and runs its checks,
//! every mistake gives one error that points at the user's token.
//!
//! Run: `cargo test -p idem-tests --test ui`. After changing a message, regenerate the snapshots
//! with `TRYBUILD=overwrite cargo test -p idem-tests --test ui` and read each `.stderr` file.
//! The toolchain is pinned (`rust-toolchain.toml`) so that the snapshots do not drift.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("ui/pass/*.rs");
    cases.compile_fail("ui/fail/*.rs");
}
