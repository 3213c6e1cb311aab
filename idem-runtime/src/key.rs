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

/// The rules of message keys and consumer names: non-empty, at most `max` bytes, no NUL.
///
/// A `const fn`, so that `#[idempotent]` checks a consumer name at compile time with the very
/// rules [`ConsumerName::new`] applies at run time.
const fn check(value: &str, what: &'static str, max: usize) -> Result<(), KeyError> {
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Err(KeyError::Empty { what });
    }
    if bytes.len() > max {
        return Err(KeyError::TooLong {
            what,
            len: bytes.len(),
            max,
        });
    }
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == 0 {
            return Err(KeyError::ContainsNul { what });
        }
        i += 1;
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
        check(&key, "message key", Self::MAX_LEN)?;
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
        Self::check(&name)?;
        Ok(Self(name.into_boxed_str()))
    }

    /// Checks `name` without allocating: the rules of [`ConsumerName::new`], usable in constants
    /// (`#[idempotent]` checks its consumer names with it at compile time).
    ///
    /// ```
    /// use idem_runtime::admin::ConsumerName;
    /// const BILLING: () = assert!(ConsumerName::check("billing").is_ok());
    /// assert!(ConsumerName::check("").is_err());
    /// ```
    pub const fn check(name: &str) -> Result<(), KeyError> {
        check(name, "consumer name", Self::MAX_LEN)
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

/// A value a message key can be made from.
///
/// `#[idempotent(key = <expr>)]` passes its expression through this trait, and so can a
/// hand-written [`Handler::key`](crate::Handler::key). Each kind of value has one text form,
/// which is what the inbox stores: it never changes between versions.
///
/// | value | key |
/// |---|---|
/// | `str`, `String`, `Cow<str>` | the string itself |
/// | `u8` … `u128`, `i8` … `i128`, `usize`, `isize` | decimal, with `-` for a negative number |
/// | `bool` | `true` or `false` |
/// | `char` | the character |
/// | `Uuid` | hyphenated lower case: `67e55044-10b1-426f-9247-bb680e5fe0c8` |
/// | `MessageKey`, `Result<MessageKey, KeyError>` | itself (`MessageKey::cloud_event(..)`) |
/// | `Option<T>` | the key of `T`; `None` (a message without the field) is [`KeyError::Missing`] |
/// | `&T` | the key of `T` |
/// | a tuple of two to six of these | a composite key, below |
///
/// Floating-point numbers are refused: equal amounts can print differently (`0.1 + 0.2` prints
/// `0.30000000000000004`), so a key made from one is not stable. Key on an integer (an amount
/// in cents, a sequence number) or format the value yourself.
///
/// # Composite keys
///
/// A tuple such as `(order.tenant, order.id)` makes one key of several values. Each component
/// is first made into a key on its own (so an empty string or a `None` is refused as it would be
/// alone); in each, `\` is written `\\` and `/` is written `\/`; the components are then joined
/// with `/`. So `("acme", 42)` is `acme/42`, `("a/b", "c")` is `a\/b/c` and `("a", "b/c")` is
/// `a/b\/c`: two different tuples of the same types never give the same key, whatever their
/// components contain (a nested tuple is escaped once more inside its parent). The whole key is then checked
/// like any other ([`MessageKey::MAX_LEN`] applies to the joined form).
///
/// ```
/// use idem_runtime::transport::KeySource;
/// let key = ("acme", 42u64).to_message_key().unwrap();
/// assert_eq!(key.as_str(), "acme/42");
/// assert_ne!(("a/b", "c").to_message_key(), ("a", "b/c").to_message_key());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a message key",
    label = "not a message key",
    note = "a key is a string, an integer, a `bool`, a `char`, a `Uuid`, a `MessageKey`, an `Option` or a reference of one, or a tuple of two to six of them",
    note = "a floating-point number is refused because equal amounts can print differently: key on an integer (an amount in cents, a sequence number) or format the value yourself"
)]
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

/// Values whose key is their `Display` form: integers in decimal, `true`/`false`, the
/// character, the hyphenated lower-case UUID.
macro_rules! display_key_source {
    ($($ty:ty),*) => {$(
        impl KeySource for $ty {
            fn to_message_key(&self) -> Result<MessageKey, KeyError> {
                MessageKey::new(self.to_string())
            }
        }
    )*};
}
display_key_source!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    bool,
    char,
    uuid::Uuid
);

/// The composite key of a tuple's components (see [`KeySource`]): each escaped (`\` → `\\`,
/// `/` → `\/`) and joined with `/`.
fn composite(components: &[&dyn KeySource]) -> Result<MessageKey, KeyError> {
    let mut key = String::new();
    for (position, component) in components.iter().enumerate() {
        if position > 0 {
            key.push('/');
        }
        let component = component.to_message_key().map_err(|error| match error {
            KeyError::Empty { .. } => KeyError::Empty {
                what: "component of a composite message key",
            },
            other => other,
        })?;
        for c in component.as_str().chars() {
            if c == '\\' || c == '/' {
                key.push('\\');
            }
            key.push(c);
        }
    }
    MessageKey::new(key)
}

macro_rules! tuple_key_source {
    ($(($($part:ident),+))*) => {$(
        impl<$($part: KeySource),+> KeySource for ($($part,)+) {
            fn to_message_key(&self) -> Result<MessageKey, KeyError> {
                #[allow(non_snake_case)]
                let ($($part,)+) = self;
                composite(&[$($part as &dyn KeySource),+])
            }
        }
    )*};
}
tuple_key_source! {
    (A, B)
    (A, B, C)
    (A, B, C, D)
    (A, B, C, D, E)
    (A, B, C, D, E, F)
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
    fn consumer_names_follow_the_same_rules_in_constants() {
        const OK: Result<(), KeyError> = ConsumerName::check("billing");
        assert_eq!(OK, Ok(()));
        let long = "c".repeat(ConsumerName::MAX_LEN + 1);
        assert_eq!(
            ConsumerName::check(&long),
            ConsumerName::new(long.as_str()).map(|_| ())
        );
        assert!(ConsumerName::check(&long[1..]).is_ok());
        assert!(matches!(
            ConsumerName::check("a\0b"),
            Err(KeyError::ContainsNul { .. })
        ));
    }

    #[test]
    fn every_scalar_has_one_text_form() {
        assert_eq!(7u8.to_message_key().unwrap().as_str(), "7");
        assert_eq!((-7i8).to_message_key().unwrap().as_str(), "-7");
        assert_eq!(65_535u16.to_message_key().unwrap().as_str(), "65535");
        assert_eq!((-2isize).to_message_key().unwrap().as_str(), "-2");
        assert_eq!(true.to_message_key().unwrap().as_str(), "true");
        assert_eq!('é'.to_message_key().unwrap().as_str(), "é");
        let id = uuid::Uuid::from_u128(0x67e5_5044_10b1_426f_9247_bb68_0e5f_e0c8);
        assert_eq!(
            id.to_message_key().unwrap().as_str(),
            "67e55044-10b1-426f-9247-bb680e5fe0c8"
        );
        assert!(matches!(
            '\0'.to_message_key(),
            Err(KeyError::ContainsNul { .. })
        ));
    }

    #[test]
    fn composite_keys_escape_and_join() {
        assert_eq!(
            ("acme", 42u64).to_message_key().unwrap().as_str(),
            "acme/42"
        );
        assert_eq!(("a/b", "c").to_message_key().unwrap().as_str(), "a\\/b/c");
        assert_eq!(("a\\", "b").to_message_key().unwrap().as_str(), "a\\\\/b");
        let tenant = String::from("t");
        let id = uuid::Uuid::nil();
        assert_eq!(
            (&tenant, id, 'x', false).to_message_key().unwrap().as_str(),
            "t/00000000-0000-0000-0000-000000000000/x/false"
        );
        assert_eq!(
            (("a", "b"), "c").to_message_key().unwrap().as_str(),
            "a\\/b/c"
        );
    }

    #[test]
    fn no_two_distinct_tuples_encode_alike() {
        // Components chosen to collide under a naive join: the separator, the escape, both,
        // at either end, and doubled.
        let atoms = [
            "a", "b", "/", "\\", "a/", "/a", "a\\", "\\/", "/\\", "a/b", "//", "\\\\",
        ];
        fn distinct(keys: Vec<(String, Result<MessageKey, KeyError>)>) {
            let mut seen = std::collections::HashMap::new();
            for (tuple, key) in keys {
                let key = key.unwrap();
                if let Some(previous) = seen.insert(key.clone(), tuple.clone()) {
                    panic!("{previous} and {tuple} both encode as {key:?}");
                }
            }
        }
        // Pairs and triples together: the arity shows in the key too.
        let mut flat = Vec::new();
        // A nested tuple: injective for its own type, like every key type.
        let mut nested = Vec::new();
        for a in atoms {
            for b in atoms {
                flat.push((format!("({a:?}, {b:?})"), (a, b).to_message_key()));
                for c in atoms {
                    let tuple = format!("({a:?}, {b:?}, {c:?})");
                    flat.push((tuple, (a, b, c).to_message_key()));
                    let tuple = format!("(({a:?}, {b:?}), {c:?})");
                    nested.push((tuple, ((a, b), c).to_message_key()));
                }
            }
        }
        distinct(flat);
        distinct(nested);
    }

    #[test]
    fn composite_components_are_checked() {
        assert_eq!(
            ("", "x").to_message_key(),
            Err(KeyError::Empty {
                what: "component of a composite message key"
            })
        );
        assert_eq!(
            ("x", Option::<u64>::None).to_message_key(),
            Err(KeyError::Missing("key"))
        );
        let long = "k".repeat(200);
        assert!(matches!(
            (&long, &long).to_message_key(),
            Err(KeyError::TooLong { len: 401, .. })
        ));
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
