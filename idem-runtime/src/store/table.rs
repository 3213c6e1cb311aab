//! The inbox table's validated name, and the suffixes of the tables beside it (each backend's
//! room writes their schemas: `sql/`).

use crate::error::ConfigError;

/// A validated inbox table name: 1 to [`TableName::MAX_LEN`] ASCII letters, digits or
/// underscores, not starting with a digit. It is spliced into SQL, so nothing else is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// The longest name accepted, leaving room for the index name derived from it.
    pub const MAX_LEN: usize = 48;

    /// The table name used when none is configured.
    pub const DEFAULT: &'static str = "idem_inbox";

    /// Validates `name`.
    ///
    /// ```
    /// use idem_runtime::schema::TableName;
    /// assert!(TableName::new("billing_inbox").is_ok());
    /// assert!(TableName::new("inbox; DROP TABLE orders").is_err());
    /// assert!(TableName::new("1inbox").is_err());
    /// ```
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if valid {
            Ok(Self(name))
        } else {
            Err(ConfigError::InvalidTableName(name))
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub(crate) use super::sql::{DUP_DAILY, KEY_DIGEST};

/// The suffixes of the tables earlier versions kept beside the inbox (summaries by process,
/// digests in one blob a filter), which this version neither reads nor writes.
#[cfg(feature = "migration")]
pub(crate) const FORMER_COMPANIONS: [&str; 2] = ["duplicates", "digest"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers() {
        for bad in ["", "a-b", "a b", "a\"b", "9lives", "é", &"x".repeat(49)] {
            assert!(TableName::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["inbox", "_inbox", "Inbox_2", &"x".repeat(48)] {
            assert!(TableName::new(good).is_ok(), "{good:?} refused");
        }
    }
}
