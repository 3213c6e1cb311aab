//! Guide pages: the reading that is longer than an item's documentation.

#[doc = include_str!("guide/relay.md")]
pub mod relay {}
