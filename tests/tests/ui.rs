//! Compile-time behaviour of `#[idempotent]`: every supported form compiles and runs its checks,
//! every mistake gives one error that points at the user's token.
//!
//! Run: `cargo test -p idem-tests --test ui`. After changing a message, regenerate the snapshots
//! with `TRYBUILD=overwrite cargo test -p idem-tests --test ui` and read each `.stderr` file.
//! The toolchain is pinned (`rust-toolchain.toml`) so that the snapshots do not drift.

#[test]
fn ui() {
    // The mistakes on their own: trybuild checks them all in one cargo run only when no case
    // of the same set must pass (one run per case otherwise, a minute more).
    {
        let mistakes = trybuild::TestCases::new();
        mistakes.compile_fail("ui/fail/*.rs");
    }
    let forms = trybuild::TestCases::new();
    forms.pass("ui/pass/*.rs");
}
