//! Guide pages: the reading that is longer than an item's documentation.

#[cfg(feature = "macros")]
#[doc = include_str!("guide/attribute.md")]
pub mod attribute {}

#[doc = include_str!("guide/backends.md")]
pub mod backends {}

#[doc = include_str!("guide/guarantees.md")]
pub mod guarantees {}
