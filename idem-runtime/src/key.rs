//! Message keys, consumer names and the inbox key they form together.

use std::borrow::Borrow;
use std::fmt;

/// Why a message key or a consumer name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key (or consumer name) is the empty string.
    #[error("the {what} is empty")]
    Empty {
        /// `"message key"` or `"consumer name"`.
        what: &'static str,
    },
    /// The key is longer than the documented limit; it is never truncated.
    #[error("the {what} is {len} bytes long, more than the limit of {max} bytes")]
    TooLong {
        /// `"message key"` or `"consumer name"`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The key contains a NUL character, which PostgreSQL cannot store.
    #[error("the {what} contains a NUL character")]
    ContainsNul {
        /// `"message key"` or `"consumer name"`.
        what: &'static str,
    },
    /// The message carries no value where the key was to be read from.
    #[error("the message has no {0}")]
    Missing(&'static str),
}

fn validate(value: &str, what: &'static str, max: usize) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::Empty { what });
    }
    if value.len() > max {
        return Err(KeyError::TooLong {
            what,
            len: value.len(),
            max,
        });
    }
    if value.contains('\0') {
        return Err(KeyError::ContainsNul { what });
    }
    Ok(())
}

/// The stable identity of a logical message: a producer-assigned message id, a business
/// idempotency key, or a CloudEvents `source` + `id`.
///
/// Never build it from a delivery tag, a redelivery count or a receive timestamp: those change
/// between deliveries of the same message.
///
/// A key is non-empty, at most [`MessageKey::MAX_LEN`] bytes of UTF-8 and free of NUL characters.
/// Longer keys are refused, never truncated: two keys sharing a prefix must not collide.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageKey(Box<str>);

impl MessageKey {
    /// The longest key accepted, in bytes.
    pub const MAX_LEN: usize = 255;

    /// Validates `key` as a message key.
    ///
    /// ```
    /// use idem_runtime::{KeyError, MessageKey};
    /// assert_eq!(MessageKey::new("order-42").unwrap().as_str(), "order-42");
    /// assert!(matches!(MessageKey::new(""), Err(KeyError::Empty { .. })));
    /// assert!(matches!(MessageKey::new("x".repeat(256)), Err(KeyError::TooLong { .. })));
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        validate(&key, "message key", Self::MAX_LEN)?;
        Ok(Self(key.into_boxed_str()))
    }

    /// The key of a CloudEvent, from its `source` and `id` attributes.
    ///
    /// The two are joined so that no two different pairs give the same key: the source's length
    /// is written before it, so `("a:b", "c")` and `("a", "b:c")` stay apart.
    ///
    /// ```
    /// use idem_runtime::MessageKey;
    /// let one = MessageKey::cloud_event("a:b", "c").unwrap();
    /// let two = MessageKey::cloud_event("a", "b:c").unwrap();
    /// assert_ne!(one, two);
    /// ```
    pub fn cloud_event(source: &str, id: &str) -> Result<Self, KeyError> {
        if source.is_empty() {
            return Err(KeyError::Missing("CloudEvents source"));
        }
        if id.is_empty() {
            return Err(KeyError::Missing("CloudEvents id"));
        }
        Self::new(format!("ce:{}:{source}{id}", source.len()))
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for MessageKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for MessageKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for MessageKey {
    type Error = KeyError;
    fn try_from(value: String) -> Result<Self, KeyError> {
        Self::new(value)
    }
}

impl TryFrom<&str> for MessageKey {
    type Error = KeyError;
    fn try_from(value: &str) -> Result<Self, KeyError> {
        Self::new(value)
    }
}

/// The name of a consumer: the first half of the inbox key.
///
/// Each consumer of a pub/sub channel tracks its own completions, so two consumers that receive
/// the same message both process it. A name is non-empty, at most [`ConsumerName::MAX_LEN`]
/// bytes and free of NUL characters. Renaming a consumer forgets what it has processed.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerName(Box<str>);

impl ConsumerName {
    /// The longest name accepted, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Validates `name` as a consumer name.
    pub fn new(name: impl Into<String>) -> Result<Self, KeyError> {
        let name = name.into();
        validate(&name, "consumer name", Self::MAX_LEN)?;
        Ok(Self(name.into_boxed_str()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ConsumerName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The primary key of an inbox record: which consumer processed which message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboxKey {
    /// The consumer that processes the message.
    pub consumer: ConsumerName,
    /// The message's key.
    pub message_key: MessageKey,
}

impl fmt::Display for InboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.consumer, self.message_key)
    }
}

/// A value a message key can be made from: strings, integers, UUIDs, a [`MessageKey`], or the
/// result of building one (`MessageKey::cloud_event(..)`).
///
/// `#[idempotent(key = <expr>)]` passes its expression through this trait. `None` (a message
/// without the field) is a [`KeyError::Missing`].
pub trait KeySource {
    /// Makes and validates the key.
    fn to_message_key(&self) -> Result<MessageKey, KeyError>;
}

impl KeySource for str {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::new(self)
    }
}

impl KeySource for String {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::new(self.as_str())
    }
}

impl KeySource for std::borrow::Cow<'_, str> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::new(self.as_ref())
    }
}

impl KeySource for MessageKey {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        Ok(self.clone())
    }
}

impl KeySource for Result<MessageKey, KeyError> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        self.clone()
    }
}

impl<T: KeySource + ?Sized> KeySource for &T {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        (**self).to_message_key()
    }
}

impl<T: KeySource> KeySource for Option<T> {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        match self {
            Some(value) => value.to_message_key(),
            None => Err(KeyError::Missing("key")),
        }
    }
}

macro_rules! integer_key_source {
    ($($ty:ty),*) => {$(
        impl KeySource for $ty {
            fn to_message_key(&self) -> Result<MessageKey, KeyError> {
                MessageKey::new(self.to_string())
            }
        }
    )*};
}
integer_key_source!(u16, u32, u64, u128, i16, i32, i64, i128, usize);

impl KeySource for uuid::Uuid {
    fn to_message_key(&self) -> Result<MessageKey, KeyError> {
        MessageKey::new(self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_at_the_limit_pass_and_beyond_fail() {
        assert!(MessageKey::new("k".repeat(MessageKey::MAX_LEN)).is_ok());
        assert_eq!(
            MessageKey::new("k".repeat(MessageKey::MAX_LEN + 1)),
            Err(KeyError::TooLong {
                what: "message key",
                len: 256,
                max: 255
            })
        );
        // The limit is in bytes: 128 two-byte characters are 256 bytes.
        assert!(MessageKey::new("é".repeat(128)).is_err());
    }

    #[test]
    fn nul_and_empty_are_refused() {
        assert!(matches!(
            MessageKey::new("a\0b"),
            Err(KeyError::ContainsNul { .. })
        ));
        assert!(matches!(ConsumerName::new(""), Err(KeyError::Empty { .. })));
    }

    #[test]
    fn cloud_event_keys_do_not_collide() {
        let pairs = [("a:b", "c"), ("a", "b:c"), ("ab", "c"), ("a", "bc")];
        let keys: std::collections::HashSet<_> = pairs
            .iter()
            .map(|(s, i)| MessageKey::cloud_event(s, i).unwrap())
            .collect();
        assert_eq!(keys.len(), pairs.len());
        assert_eq!(
            MessageKey::cloud_event("", "1"),
            Err(KeyError::Missing("CloudEvents source"))
        );
    }

    #[test]
    fn key_sources_convert() {
        assert_eq!(42u64.to_message_key().unwrap().as_str(), "42");
        assert_eq!(Some("x").to_message_key().unwrap().as_str(), "x");
        assert_eq!(
            Option::<String>::None.to_message_key(),
            Err(KeyError::Missing("key"))
        );
    }
}
