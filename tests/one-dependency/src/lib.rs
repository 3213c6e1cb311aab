//! A handler crate that depends on `idem` alone; its test is in `tests/`.
